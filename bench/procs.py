"""CPU time and memory of a process, read from /proc.

psutil is not a dependency of the project, and the figures need only two
numbers per process (user+sys seconds, resident set size), which Linux exposes
in /proc/<pid>/stat and /proc/<pid>/status. A worker runs its tasks in threads
of one process, so its own counters already include every thread.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + sys CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        raw = handle.read().decode()
    # The command name (field 2) may hold spaces; fields after its ')' are fixed.
    fields = raw[raw.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_bytes(pid: int) -> int:
    """Resident set size now (VmRSS)."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Highest resident set size so far (VmHWM)."""
    return _status_kib(pid, "VmHWM") * 1024


@dataclass
class ChildRun:
    """What a finished child process cost: exit code, wall time, CPU, peak RSS."""
    returncode: int
    wall_seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    output: str
    hwm_bytes: int = 0  # the highest VmHWM read while it ran (its own memory since its exec)


def run_measured(argv: list[str], env: dict[str, str], cwd: str | None = None,
                 timeout: float = 900.0) -> ChildRun:
    """Run a child to completion and take its own rusage with wait4.

    `resource.getrusage(RUSAGE_CHILDREN)` would report the maximum over every
    child ever waited for; wait4 on the pid gives this child's peak RSS alone.
    But Linux carries into a child's `ru_maxrss` the RSS of the process it was
    forked from (the bench, large after writing shards), so `hwm_bytes` also
    reads the child's own VmHWM every 50 ms while it runs.
    """
    import tempfile
    import time

    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        deadline = started + timeout
        hwm = 0
        while True:
            try:
                hwm = max(hwm, peak_rss_bytes(popen.pid))
            except (OSError, KeyError):  # exiting: its memory is gone from /proc
                pass
            pid, status, usage = os.wait4(popen.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                popen.kill()
                pid, status, usage = os.wait4(popen.pid, 0)
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        popen.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
        log.seek(0)
        output = log.read().decode(errors="replace")
    return ChildRun(popen.returncode, wall, usage.ru_utime + usage.ru_stime,
                    usage.ru_maxrss * 1024, output, hwm)


def tree_cpu_seconds(pid: int) -> float:
    """user + sys CPU seconds of a process and every live descendant (children via /proc)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo += [int(child) for child in handle.read().split()]
        except OSError:  # exited meanwhile
            continue
    return total


def thread_count(pid: int) -> int:
    return _status_kib(pid, "Threads")


def redis_connections_of(client, pid: int) -> list[dict]:
    """The entries of Redis's CLIENT LIST whose connection is a socket of process `pid` (its
    own connections, matched through /proc by both ends, whoever else talks to Redis).

    Both ends, not the local port alone: Linux reuses an ephemeral port for connections to
    different places, so a process's socket to an HTTP server can share its local port with
    another process's connection to Redis."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ends = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ends.add((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return [c for c in client.client_list()
            if (int(c["addr"].rsplit(":", 1)[1]), int(c["laddr"].rsplit(":", 1)[1])) in ends]
