"""When the worker process itself is the bottleneck: its CPU near what it can use, its servers with free slots.

One worker process runs its task threads under one GIL, so it can use at most
about one core, however many the node has (less where its cgroup's CPU
quota gives it less). Where a server finishes more answers a second
than one process can turn into durable samples (short answers on a large
batch), the server runs below its batch and adding threads or in-flight
requests does not help: another worker process on the node does.

**The share** is the CPU the process used over an interval, against the CPU
time it had the chance to use: the lesser of what its usable cores allow
(`cpu_limits`: one, or a cgroup quota's fraction) over the interval and what
it used plus the time the CPUs it may run on sat idle (`/proc/stat`; the
cores alone where there is none). Measured against its cores alone, a worker
that wanted its whole core on a node busy with other work (the 2-core test
machine with other tests beside it, a GPU node's own processes) got 0.5-0.7
of it and never looked bound; but a CPU it may use that sat idle is CPU it
did not want (the scheduler leaves no CPU idle while a thread of the
process is runnable on it), and on a busy node there is none. The threads'
own waits for a core (`/proc/self/task/*/schedstat`) do not tell it: summed
over the ~900 threads, hundreds of which a group commit wakes at once, they
came to 1-6 times the wall time while the process used a third of its core
and the node had a core idle (44 times under a quarter-core quota), and read
as a share of 1. The idle CPUs count only for a process that used at least
`DEMAND_FLOOR` of its cores: below that it was not asking for CPU (its run
over, its queue empty), and a node busy with other work must not make an idle
worker look bound; a process that wants its core gets more than that floor
from the scheduler on any node it can share with.

`CpuBoundRule` is that judgement, pure (no clock, no /proc): each observation
is the share and its servers' free slots (capacity minus running, as last
reported). It turns *bound* only after the share stayed at or above `enter`
with at least `FREE_SHARE` of the slots free for `window` seconds, and turns
back only after the share stayed below `leave` (lower: hysteresis) or the
servers stayed full (less than half of `FREE_SHARE` free: hysteresis too)
for `window` seconds, so one busy moment or one full batch never flips it
and a state change is reported once. The remedy it names is another worker
process, or, where a cgroup quota below one core is the limit, that quota
(another process in the group would share it). `CpuWatch` feeds it from
`time.process_time`, the idle time of its CPUs and the server pool, and logs each
change once.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from contract.counts import counted

from .cpu_limits import CoreLimit, core_limit

log = logging.getLogger(__name__)

ENTER_SHARE = 0.85     # of the usable cores: the process is at its limit (FLEET_CPU_BOUND_SHARE)
HYSTERESIS = 0.15      # back below ENTER_SHARE less this: no longer
FREE_SHARE = 1 / 8     # of the servers' slots free (the tuner's headroom): the servers could take more
WINDOW_SECONDS = 10.0  # how long either condition must hold before the state changes (FLEET_CPU_BOUND_SECONDS)
DEMAND_FLOOR = 0.25    # of its usable cores: a process that used less was not asking for CPU (idle CPUs not counted)
REMEDY = "start another worker process on this node (same SGLANG_URLS)"


@dataclass(frozen=True)
class Reading:
    """One interval: CPU used as a share of the usable cores, and the servers' free slots."""
    share: float
    free_slots: int
    slots: int
    idle: float | None = None  # cores the node left idle on the CPUs the process may use (mean); None: unknown

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


def idle_seconds(cpus: Iterable[int], stat: Path = Path("/proc/stat")) -> float | None:
    """Seconds the CPUs `cpus` have sat idle since boot (the idle and iowait columns of their `cpuN`
    lines, in clock ticks); None where there is no such file, or it lists none of them (a container
    whose /proc/stat numbers its CPUs from 0 while its affinity names the host's)."""
    wanted = {f"cpu{n}" for n in cpus}
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    found = [f for f in map(str.split, lines) if f and f[0] in wanted and len(f) > 5]
    if not found:
        return None
    return sum(int(f[4]) + int(f[5]) for f in found) / os.sysconf("SC_CLK_TCK")


def share_of_chance(used: float, wall: float, idle: float | None, cores: float) -> float:
    """CPU used over the CPU time the process had the chance to use: the lesser of what its usable
    cores allow over the wall time and what it used plus its CPUs' idle time (unknown, or a process
    that used under `DEMAND_FLOOR` of its cores: the cores alone). Never above 1."""
    asking = used >= DEMAND_FLOOR * cores * wall
    chance = cores * wall if idle is None or not asking else min(cores * wall, used + max(idle, 0.0))
    return used / max(chance, used, 1e-9)


def remedy_for(limit: CoreLimit) -> str:
    """What to change: under a cgroup quota below one core, the quota (another process in the same
    group shares it); otherwise the number of worker processes on the node."""
    if limit.quota_file is None:
        return REMEDY
    return (f"raise this worker's CPU quota ({_cores(limit.cores)}, {limit.quota_file}; the container's CPU "
            "limit) to at least 1 core: another worker process in the same cgroup shares the same quota")


def rule_for(share: float, seconds: float) -> CpuBoundRule:
    """The rule with the worker's settings (`FLEET_CPU_BOUND_SHARE`, `FLEET_CPU_BOUND_SECONDS`)."""
    return CpuBoundRule(enter=share, leave=share - HYSTERESIS, window=seconds)


class CpuWatch:
    """Measures the process's CPU between calls and applies the rule; one log line per change."""

    def __init__(self, rule: CpuBoundRule | None = None, limit: CoreLimit | None = None):
        self.rule = rule or CpuBoundRule()
        self.limit = limit or core_limit()
        self.cores, self.remedy = self.limit.cores, remedy_for(self.limit)
        self.last: Reading | None = None
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        self._mark = (time.monotonic(), time.process_time(), idle_seconds(self._cpus))

    def observe(self, free_slots: int, slots: int) -> Reading | None:
        """Called once per health round with the servers' free and total slots."""
        now, cpu, idle_now = time.monotonic(), time.process_time(), idle_seconds(self._cpus)
        wall, used = now - self._mark[0], cpu - self._mark[1]
        idle = idle_now - self._mark[2] if idle_now is not None and self._mark[2] is not None else None
        self._mark = (now, cpu, idle_now)
        if wall <= 0:
            return self.last
        self.last = Reading(round(share_of_chance(used, wall, idle, self.cores), 3), free_slots, slots,
                            None if idle is None else round(max(idle, 0.0) / wall, 2))
        if self.rule.observe(self.last, now):
            self._log_change()
        return self.last

    def _log_change(self) -> None:
        r = self.last
        assert r is not None
        if self.rule.bound:
            log.warning("worker CPU-bound: this process used %.0f%% of the %s it can use over %.0fs while "
                        "its servers had %d of %d slots free; %s%s", 100 * r.share, _cores(self.cores),
                        self.rule.window, r.free_slots, r.slots, self.remedy, busy_node_note(r.idle, self.cores))
        else:
            log.warning("worker no longer CPU-bound: %.0f%% of its %s, servers %d of %d slots free",
                        100 * r.share, _cores(self.cores), r.free_slots, r.slots)

    def snapshot(self) -> dict:
        """For the heartbeat (`status`): the last reading, whether bound, and the remedy when it is."""
        r = self.last
        found = {"bound": self.rule.bound, "share": r.share if r else None, "idle": r.idle if r else None,
                 "cores": self.cores,
                 "free_slots": r.free_slots if r else None, "slots": r.slots if r else None}
        if self.rule.bound:
            found["remedy"] = self.remedy
        return found


def _cores(n: float, spec: str = ".3g") -> str:
    """A share of cores as the log says it: "1 core", "0.25 cores"."""
    return counted(n, "core", spec=spec)


def busy_node_note(idle: float | None, cores: float) -> str:
    """Where the node left less than half a core idle, its cores are busy too: said, since another
    worker process then helps only as far as the node has cores to spare. Not under a quota below
    one core: there the quota is the remedy."""
    if idle is None or cores < 1.0 or idle >= 0.5:
        return ""
    return (f" (the node's CPUs it may use sat idle {_cores(idle, '.2g')} on average: they are busy, so that "
            "helps only where the node has cores to spare)")
