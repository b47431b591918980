"""When the worker process itself is the bottleneck: its CPU near what it can use, its servers with free slots.

One worker process runs its task threads under one GIL, so it can use at most
about one core, however many the node has (fewer where its CPU affinity or
cgroup quota gives it less). Where a server finishes more answers a second
than one process can turn into durable samples (short answers on a large
batch), the server runs below its batch and adding threads or in-flight
requests does not help: another worker process on the node does.

**The share** is the CPU the process used over an interval, against the CPU
time it had the chance to use: the wall time less the time its threads sat
runnable waiting for a core (`/proc/self/task/*/schedstat`, where the kernel
keeps it; the wall time alone elsewhere), over the usable cores. Measured
against the wall time alone, a worker that wanted its whole core on a node
busy with other work (the 2-core test machine with other tests beside it, a
GPU node's own processes) got 0.5-0.7 of it: its share never reached the
line there (the bench's `1x256:short/w1`), or crossed it and back with the
machine's load (the real-process test). Time spent waiting for a core is
CPU it wanted.

`CpuBoundRule` is that judgement, pure (no clock, no /proc): each observation
is the share and its servers' free slots (capacity minus running, as last
reported). It turns *bound* only after the share stayed at or above `enter`
with at least `FREE_SHARE` of the slots free for `window` seconds, and turns
back only after the share stayed below `leave` (lower: hysteresis) or the
servers stayed full (less than half of `FREE_SHARE` free: hysteresis too)
for `window` seconds, so one busy moment or one full batch never flips it
and a state change is reported once. `CpuWatch` feeds it from
`time.process_time`, the schedstat waits and the server pool, and logs each
change once.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENTER_SHARE = 0.85     # of the usable cores: the process is at its limit (FLEET_CPU_BOUND_SHARE)
HYSTERESIS = 0.15      # back below ENTER_SHARE less this: no longer
FREE_SHARE = 1 / 8     # of the servers' slots free (the tuner's headroom): the servers could take more
WINDOW_SECONDS = 10.0  # how long either condition must hold before the state changes (FLEET_CPU_BOUND_SECONDS)
REMEDY = "start another worker process on this node (same SGLANG_URLS)"


@dataclass(frozen=True)
class Reading:
    """One interval: CPU used as a share of the usable cores, and the servers' free slots."""
    share: float
    free_slots: int
    slots: int
    waited: float = 0.0  # of the interval, the time its threads waited for a core (summed; overlaps count twice)

    @property
    def servers_have_room(self) -> bool:
        return self.slots > 0 and self.free_slots >= max(1, self.slots * FREE_SHARE)

    @property
    def servers_full(self) -> bool:
        """Fewer than half of `FREE_SHARE` of the slots free (or none known): ends a bound state."""
        return self.slots <= 0 or self.free_slots < max(1, self.slots * FREE_SHARE / 2)


@dataclass
class CpuBoundRule:
    """Bound or not, with a sustained window and two thresholds (see the module docstring)."""
    enter: float = ENTER_SHARE
    leave: float = ENTER_SHARE - HYSTERESIS
    window: float = WINDOW_SECONDS
    bound: bool = False
    _pending_since: float | None = None  # when the readings began to point the other way

    def observe(self, reading: Reading, now: float) -> bool:
        """Note one reading; True when it changed `bound`."""
        if self.bound:
            other_way = reading.share < self.leave or reading.servers_full
        else:
            other_way = reading.share >= self.enter and reading.servers_have_room
        if not other_way:
            self._pending_since = None
            return False
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since < self.window:
            return False
        self.bound, self._pending_since = not self.bound, None
        return True


def usable_cores() -> float:
    """Cores this process can use: one (the GIL), or less where its affinity or cgroup quota allows less."""
    cores = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
    quota = _cgroup_quota()
    return min(1.0, cores, quota if quota else cores)


def _cgroup_quota() -> float | None:
    """cgroup v2 `cpu.max` ("max 100000" or "50000 100000") as cores, or None when unlimited or unknown."""
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)


def waited_seconds() -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a core, summed over its
    live threads (the second field of each `/proc/self/task/<tid>/schedstat`, in ns); None where
    the kernel does not keep it."""
    total, found = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, ValueError, IndexError):  # a thread that just ended
            continue
    return total / 1e9 if found else None


def share_of_chance(used: float, wall: float, waited: float, cores: float) -> float:
    """CPU used over the CPU time the process had the chance to use: the wall time less its
    threads' wait for a core (never below what it used), over the usable cores."""
    chance = max(wall - max(waited, 0.0), used, 1e-9)
    return used / chance / cores


def rule_for(share: float, seconds: float) -> CpuBoundRule:
    """The rule with the worker's settings (`FLEET_CPU_BOUND_SHARE`, `FLEET_CPU_BOUND_SECONDS`)."""
    return CpuBoundRule(enter=share, leave=share - HYSTERESIS, window=seconds)


class CpuWatch:
    """Measures the process's CPU between calls and applies the rule; one log line per change."""

    def __init__(self, rule: CpuBoundRule | None = None, cores: float | None = None):
        self.rule = rule or CpuBoundRule()
        self.cores = cores or usable_cores()
        self.last: Reading | None = None
        self._mark = (time.monotonic(), time.process_time(), waited_seconds())

    def observe(self, free_slots: int, slots: int) -> Reading | None:
        """Called once per health round with the servers' free and total slots."""
        now, cpu, waits = time.monotonic(), time.process_time(), waited_seconds()
        wall, used = now - self._mark[0], cpu - self._mark[1]
        # A thread that ended takes its waits with it: a negative difference counts as none.
        waited = waits - self._mark[2] if waits is not None and self._mark[2] is not None else 0.0
        self._mark = (now, cpu, waits)
        if wall <= 0:
            return self.last
        self.last = Reading(round(share_of_chance(used, wall, waited, self.cores), 3), free_slots, slots,
                            round(max(waited, 0.0) / wall, 3))
        if self.rule.observe(self.last, now):
            self._log_change()
        return self.last

    def _log_change(self) -> None:
        r = self.last
        assert r is not None
        if self.rule.bound:
            log.warning("worker CPU-bound: this process used %.0f%% of the %.2g core(s) it can use over %.0fs while "
                        "its servers had %d of %d slots free; %s%s", 100 * r.share, self.cores, self.rule.window,
                        r.free_slots, r.slots, REMEDY, _busy_node(r))
        else:
            log.warning("worker no longer CPU-bound: %.0f%% of its %.2g core(s), servers %d of %d slots free",
                        100 * r.share, self.cores, r.free_slots, r.slots)

    def snapshot(self) -> dict:
        """For the heartbeat (`status`): the last reading, whether bound, and the remedy when it is."""
        r = self.last
        found = {"bound": self.rule.bound, "share": r.share if r else None, "waited": r.waited if r else None,
                 "cores": self.cores,
                 "free_slots": r.free_slots if r else None, "slots": r.slots if r else None}
        if self.rule.bound:
            found["remedy"] = REMEDY
        return found


def _busy_node(r: Reading) -> str:
    """Where the process waited for a core much of the time, the node's cores are busy too: said, since
    another worker process then helps only where the node has cores to spare."""
    if r.waited < 0.25:
        return ""
    return (f" (its threads waited for a core {100 * r.waited:.0f}% of the time: the node's cores are busy, "
            "so that helps only where it has cores to spare)")
