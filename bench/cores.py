"""Redis on a core of its own, the bench's clients on the others, while a part measures Redis.

A production Redis runs on a core no client shares. On a small machine with
the bench's clients beside it, the kernel moves Redis between cores and
deschedules it for a client, and its CPU per command (INFO cpu) and the wall
time SLOWLOG gives each command both grow with that. So while `Pinned` holds,
every thread of the Redis process runs on the first CPU this process may use
and every thread of this process on the rest; processes and threads started
meanwhile inherit the client side (Linux gives a new thread or child its
creator's mask). Other processes on the machine are not moved: a shared
machine can still put one of them on Redis's core. With one CPU there is
nothing to split and nothing is pinned.
"""
from __future__ import annotations

import os


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus` (`sched_setaffinity` moves only the thread it names)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            continue


class Pinned:
    """Redis (`redis_pid`) on one CPU, this process on the others, until the block ends; `note`
    says which (or why nothing was pinned), for the figures."""

    def __init__(self, redis_pid: int):
        self.redis_pid = redis_pid
        self.before = os.sched_getaffinity(0)
        cpus = sorted(self.before)
        self.redis_cpus, self.client_cpus = ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else (set(), set())

    @property
    def pinned(self) -> bool:
        return bool(self.redis_cpus)

    @property
    def note(self) -> str:
        if not self.pinned:
            return "not pinned (one CPU)"
        return (f"redis-server pinned to CPU {_listed(self.redis_cpus)}, the bench's clients and workers "
                f"to CPU {_listed(self.client_cpus)}")

    def __enter__(self) -> "Pinned":
        if self.pinned:
            pin(self.redis_pid, self.redis_cpus)
            pin(os.getpid(), self.client_cpus)
        return self

    def __exit__(self, *exc) -> None:
        if self.pinned:
            pin(os.getpid(), self.before)
            pin(self.redis_pid, self.before)


def _listed(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
