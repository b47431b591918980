"""When the worker process itself is the bottleneck: its CPU near what it can use, its servers with free slots.

One worker process runs its task threads under one GIL, so it can use at most
about one core, however many the node has (fewer where its CPU affinity or
cgroup quota gives it less). Where a server finishes more answers a second
than one process can turn into durable samples (short answers on a large
batch), the server runs below its batch and adding threads or in-flight
requests does not help: another worker process on the node does.

`CpuBoundRule` is that judgement, pure (no clock, no /proc): each observation
is the process's CPU use over the last interval as a share of the cores it
can use, and its servers' free slots (capacity minus running, as last
reported). It turns *bound* only after the share stayed at or above `enter`
with at least `free_share` of the slots free for `window` seconds, and turns
back only after either stayed below (`leave`, a lower share: hysteresis) for
`window` seconds, so one busy moment or one full batch never flips it and a
state change is reported once. `CpuWatch` feeds it from `time.process_time`
and the server pool, and logs each change once.
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

    @property
    def servers_have_room(self) -> bool:
        return self.slots > 0 and self.free_slots >= max(1, self.slots * FREE_SHARE)


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
            other_way = reading.share < self.leave or not reading.servers_have_room
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


def rule_for(share: float, seconds: float) -> CpuBoundRule:
    """The rule with the worker's settings (`FLEET_CPU_BOUND_SHARE`, `FLEET_CPU_BOUND_SECONDS`)."""
    return CpuBoundRule(enter=share, leave=share - HYSTERESIS, window=seconds)


class CpuWatch:
    """Measures the process's CPU between calls and applies the rule; one log line per change."""

    def __init__(self, rule: CpuBoundRule | None = None, cores: float | None = None):
        self.rule = rule or CpuBoundRule()
        self.cores = cores or usable_cores()
        self.last: Reading | None = None
        self._mark = (time.monotonic(), time.process_time())

    def observe(self, free_slots: int, slots: int) -> Reading | None:
        """Called once per health round with the servers' free and total slots."""
        now, cpu = time.monotonic(), time.process_time()
        wall, used = now - self._mark[0], cpu - self._mark[1]
        self._mark = (now, cpu)
        if wall <= 0:
            return self.last
        self.last = Reading(round(used / wall / self.cores, 3), free_slots, slots)
        if self.rule.observe(self.last, now):
            self._log_change()
        return self.last

    def _log_change(self) -> None:
        r = self.last
        assert r is not None
        if self.rule.bound:
            log.warning("worker CPU-bound: this process used %.0f%% of the %.2g core(s) it can use over %.0fs while "
                        "its servers had %d of %d slots free; %s", 100 * r.share, self.cores, self.rule.window,
                        r.free_slots, r.slots, REMEDY)
        else:
            log.warning("worker no longer CPU-bound: %.0f%% of its %.2g core(s), servers %d of %d slots free",
                        100 * r.share, self.cores, r.free_slots, r.slots)

    def snapshot(self) -> dict:
        """For the heartbeat (`status`): the last reading, whether bound, and the remedy when it is."""
        r = self.last
        found = {"bound": self.rule.bound, "share": r.share if r else None, "cores": self.cores,
                 "free_slots": r.free_slots if r else None, "slots": r.slots if r else None}
        if self.rule.bound:
            found["remedy"] = REMEDY
        return found
