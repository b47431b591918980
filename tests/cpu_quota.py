"""A child cgroup with a CPU quota, for a real process that must be held to less than a core.

Why a cgroup and not a busy neighbour: the kernel enforces a quota the same on a quiet or a busy
machine, and the worker reads it as a production worker in a container reads its CPU limit
(`workers/servers/cpu_limits.py`), so the test forces CPU-boundness honestly and the same way
each time. The process enters the group before its first instruction (`launch_in`: a shell that
writes its own pid to the group, then execs the program), so it never runs unlimited.

Needs a writable cgroup v1 `cpu` hierarchy (root on a host or a privileged container); elsewhere
the test is skipped, with that reason.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import pytest

from producer.local import Process, spawn

EIGHTH = 0.125
PERIOD_US = 100_000
V1_CPU = Path("/sys/fs/cgroup/cpu")


def _own_group() -> Path:
    """This process's group in the v1 `cpu` hierarchy (the mount itself where its path is not under it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "cpu" in controllers.split(","):
            group = V1_CPU / path.lstrip("/")
            return group if group.is_dir() else V1_CPU
    return V1_CPU


@contextlib.contextmanager
def cpu_quota_group(cores: float) -> Iterator[Path]:
    """A new child of this process's v1 `cpu` group with a quota of `cores`; on leaving, any process
    still in it goes back to the parent and the group is removed."""
    parent = _own_group()
    _sweep(parent)
    group = parent / f"fleet-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(round(cores * PERIOD_US)))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"needs a writable cgroup v1 cpu hierarchy to hold a worker to {cores} core(s) ({exc})")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it ended meanwhile
                (parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):  # busy (a process forked meanwhile): the next run sweeps it
            group.rmdir()


def _sweep(parent: Path) -> None:
    """Groups an earlier run left (killed before its cleanup), now empty, go."""
    for stale in parent.glob("fleet-test-*"):
        with contextlib.suppress(OSError):
            if not (stale / "cgroup.procs").read_text().split():
                stale.rmdir()


def launch_in(group: Path):
    """`producer.local.spawn`, but the program starts inside `group`: a shell enters it, then execs."""
    def launch(name: str, argv: list[str], logs: Path, env: dict | None = None) -> Process:
        entered = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
        return spawn(name, entered, logs, env)
    return launch
