"""The worker starts only on the library versions it is built for (`constraints.txt`, `contract/broker/versions.py`).

A different version is made honestly: a directory holding a real installed-distribution
record (`kombu-5.7.1.dist-info/METADATA`) put first on the worker's `PYTHONPATH`, which is
what `importlib.metadata` (and pip) read as the installed kombu."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contract.broker import versions

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")


def _distribution(folder: Path, name: str, version: str) -> Path:
    record = folder / f"{name}-{version}.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_given_this_install_then_every_pinned_library_is_the_version_constraints_txt_names():
    pinned = versions.pins(ROOT / "constraints.txt")
    assert {"celery", "kombu", "redis"} <= set(pinned)
    assert versions.constraints_file() == ROOT / "constraints.txt"
    assert versions.mismatches(pinned) == []
    assert versions.refusal() is None


def test_given_another_kombu_installed_when_a_worker_starts_then_it_refuses_with_one_line(tmp_path):
    # Given a kombu 5.7.1 installed ahead of the pinned 5.7.0
    elsewhere = _distribution(tmp_path / "site", "kombu", "5.7.1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(elsewhere), str(ROOT)])}

    # When a worker starts
    done = subprocess.run([str(CELERY), "-A", "workers", "worker", "--loglevel", "INFO"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)

    # Then it refuses, with one line naming the library, the version found and the one expected
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"worker refused to start: kombu 5.7.1 is installed, this worker is built for kombu==5.7.0 "
        f"({ROOT / 'constraints.txt'}; install with `pip install -c constraints.txt ...`, "
        f"or move the pin as a change of its own)"], done.stderr
    assert "celery@" not in done.stdout  # it never started


def test_given_a_library_missing_and_two_others_moved_then_the_line_names_each(tmp_path):
    pinned = {"kombu": "5.7.0", "celery": "0.0.1", "no-such-library-here": "1.0"}
    assert [str(m) for m in versions.mismatches(pinned)] == [
        "celery 5.7.0 is installed, this worker is built for celery==0.0.1",
        "no-such-library-here is not installed, this worker is built for no-such-library-here==1.0",
    ]


def test_every_install_reads_the_one_constraints_file():
    assert "-c constraints.txt" in (ROOT / "scripts" / "setup.sh").read_text()
    assert "pip install -c /src/constraints.txt" in (ROOT / "compose" / "Dockerfile").read_text()
    assert "scripts/setup.sh" in (ROOT / "scripts" / "test.sh").read_text()  # CI: .ci/run -> scripts/test.sh
    assert "constraints.txt" in (ROOT / "pyproject.toml").read_text()  # a wheel carries it


def test_http_libraries_used_only_through_their_public_api_are_not_pinned():
    # httpx is the reads' client facade over the worker's own HTTP stack (workers/servers/reads.py);
    # httpcore is not used at all: neither is pinned, and no worker module reaches past their public API
    pinned = versions.pins(ROOT / "constraints.txt")
    assert not {"httpx", "httpcore"} & set(pinned)
    for module in (ROOT / "workers").rglob("*.py"):
        text = module.read_text()
        assert "import httpcore" not in text and "httpx._" not in text, module
