"""The contract's names: run names, reason codes, key layout, kombu's internals, imports.

These are what other processes (an older worker, a dashboard, a script that
reads `dead list --json`) rely on, so each is pinned here.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract import kombu_redis
from contract.keys import RunKeys, queue_for, task_id
from contract.names import Reason
from contract.spec import BadRunName, check_run_name

ROOT = Path(__file__).resolve().parents[2]


# Run names become Redis key parts and folders under OUTPUT_DIR.
@pytest.mark.parametrize("name", ["default", "run-2026.12.01", "R_1", "A_b-c.d", "7", "a" * 128])
def test_a_safe_run_name_is_accepted(name):
    assert check_run_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "../../x", "a/../b", "/abs/path", "a/b", "a\\b", "..", "a..b",
                                  ".hidden", "-flag", "a:b", "a b", "a\nb", "x\n", "a*", "a" * 129, "é"], ids=repr)
def test_a_run_name_that_could_escape_or_collide_is_refused(name):
    with pytest.raises(BadRunName, match="is not allowed"):
        check_run_name(name)


def test_the_key_layout_is_pinned():
    keys = RunKeys("r")
    assert (keys.spec, keys.state_bucket(7), keys.legacy_state, keys.dead, keys.prompts) == (
        "fleet:run:r", "fleet:run:r:s:7", "fleet:run:r:state", "fleet:run:r:dead", "fleet:run:r:ids")
    assert queue_for("fleet.generate", None) == "fleet.generate"
    assert queue_for("fleet.generate", "m") == "fleet.generate@m"
    assert task_id("r", "p-1") == "r:p-1"


def test_every_reason_code_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [r.value for r in Reason if f"`{r.value}`" not in readme]
    assert missing == []


def test_a_reason_is_its_own_value_in_json_and_text():
    import json

    assert json.dumps({"reason": Reason.TRUNCATED}) == '{"reason": "truncated"}'
    assert f"{Reason.TRUNCATED}" == "truncated" == str(Reason.TRUNCATED)


def test_kombus_redis_internals_are_where_the_fleet_reads_them():
    assert kombu_redis.check() == []


@pytest.mark.parametrize("module, forbidden", [
    ("producer.cli", ("celery", "kombu", "workers", "pyarrow", "httpx", "transformers")),
    ("workers", ("celery", "kombu", "pyarrow", "httpx")),
    ("contract.ledger", ("celery", "pyarrow", "httpx")),
])
def test_importing_an_entry_module_builds_nothing(module, forbidden):
    code = (f"import sys, {module}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(forbidden)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_celery_finds_the_app_in_workers_celery():
    code = "from celery.app.utils import find_app; print(find_app('workers').main)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "workers"
