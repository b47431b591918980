"""The library versions a worker is built for, and its refusal to start on any other.

The worker stands on the internals of a few libraries (its kombu transport
subclasses kombu's Redis channel, QoS and poller, `workers/intake/transport.py`;
its heartbeat step Celery's; its retries redis-py's connections). An internal can
change in any release, a patch
release included, so those libraries are pinned exactly, in one file that every
install reads (`constraints.txt`: `pip install -c constraints.txt ...`), and a
worker that finds another version of any library named there refuses to start,
with one line naming each (library, version found, version expected): never a
slower or different path behind a warning. Moving a pin is a change of its own,
made with the suite run on the new version.

The file is found at the repository's root (a source checkout, an editable
install), else where a wheel installs it (`<prefix>/share/reasoning-fleet/`),
else at `FLEET_CONSTRAINTS`; a worker that finds none refuses to start too. A
library's version is its installed distribution's (`importlib.metadata`).
"""
from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

FILE = "constraints.txt"
ENV = "FLEET_CONSTRAINTS"
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(?:#.*)?$")


class Mismatch(NamedTuple):
    library: str
    found: str | None  # None: not installed
    expected: str

    def __str__(self) -> str:
        found = f"{self.library} is not installed" if self.found is None else f"{self.library} {self.found} is installed"
        return f"{found}, this worker is built for {self.library}=={self.expected}"


def constraints_file() -> Path | None:
    """The constraints file this install was made from, or None when none is found."""
    candidates = []
    if os.environ.get(ENV):
        candidates.append(Path(os.environ[ENV]))
    candidates += [Path(__file__).resolve().parents[2] / FILE,
                   Path(sys.prefix) / "share" / "reasoning-fleet" / FILE]
    return next((path for path in candidates if path.is_file()), None)


def pins(path: Path) -> dict[str, str]:
    """Library -> exact version, from each `name==version` line (comments and other lines skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            found[_normal(match.group(1))] = match.group(2)
    return found


def mismatches(pinned: dict[str, str]) -> list[Mismatch]:
    """Each pinned library whose installed version is another (or none)."""
    wrong = []
    for library, expected in pinned.items():
        try:
            found = metadata.version(library)
        except metadata.PackageNotFoundError:
            found = None
        if found != expected:
            wrong.append(Mismatch(library, found, expected))
    return wrong


def refusal() -> str | None:
    """The one line a worker refuses to start with, or None where every pin is what is installed."""
    path = constraints_file()
    if path is None:
        return (f"worker refused to start: no {FILE} found (the repository's root, "
                f"{Path(sys.prefix) / 'share' / 'reasoning-fleet'}, or ${ENV}): it names the library versions "
                "this worker is built for")
    wrong = mismatches(pins(path))
    if not wrong:
        return None
    return (f"worker refused to start: {'; '.join(map(str, wrong))} ({path}; install with "
            f"`pip install -c {FILE} ...`, or move the pin as a change of its own)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
