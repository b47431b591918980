"""How many requests to keep in flight on one server: its running batch full, a short queue behind it.

SGLang runs at most `max_running_requests` requests at once (per data-parallel
rank) and queues the rest. A client that sends fewer leaves batch slots idle;
one that sends far more builds a queue that only adds latency (and, with
several workers on one server, starves none of them better). So each binding
keeps `target` requests in flight: the server's capacity plus a small
`headroom`, a short waiting queue that hides the round trip between one
answer and the next request.

Capacity comes from what the server reports (read by `capacity_from_*`):
`/server_info`'s `internal_states[*].effective_max_running_requests_per_dp`
(2025-2026 builds; the limit the scheduler derived from memory), else its
`max_running_requests` argument times `dp_size`, else the `max_running_requests`
of each `/v1/loads` entry. Behind SGLang's model gateway a binding's capacity
is the sum over the gateway's workers. Unknown capacity starts at
`UNKNOWN_CAPACITY`.

Live load (`Load`: running and waiting requests) comes from `/v1/loads`,
`/get_load` (`num_reqs` = running + waiting) and, on 2026 builds, the
`num_running_reqs` / `num_waiting_reqs` of every answer's `meta_info`.
`Tuner.adjust` applies the rule once per window, on the window's extremes so
that one answer's momentary gap moves nothing:
- the queue stayed longer than twice the headroom (its shortest length in the
  window): shrink by half the excess over the headroom (several workers that
  share the server each give back part, so they converge without undershoot);
- the server never queued anything and never ran a full batch while this
  binding held its whole target: grow by the free slots (by an eighth where
  the capacity is unknown).
The target never leaves [1, bound] (`FLEET_MAX_INFLIGHT_PER_SERVER`), and a
server that restarts is re-read and starts again from capacity + headroom.
Pure: no HTTP, no clock of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

UNKNOWN_CAPACITY = 128  # requests in flight on a server that reports no limit (the old fixed default)
WINDOW_SECONDS = 1.0


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int


def headroom(capacity: int) -> int:
    """The waiting queue kept behind a full batch: an eighth of it, at least 2."""
    return max(2, math.ceil(capacity / 8))


def initial_target(capacity: int | None, bound: int) -> int:
    cap = capacity or UNKNOWN_CAPACITY
    return clamp(cap + headroom(cap) if capacity else cap, bound)


def clamp(target: int, bound: int) -> int:
    return max(1, min(target, bound))


def _count(value) -> int | None:
    """A non-negative int, or None (JSON may carry null, floats or strings here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def capacity_from_server_info(info: dict) -> int | None:
    """Requests the server runs at once, from `/server_info` (None: it does not say)."""
    states = info.get("internal_states")
    if isinstance(states, list) and states:
        per_rank = [_count(s.get("effective_max_running_requests_per_dp")) if isinstance(s, dict) else None
                    for s in states]
        if all(per_rank) and len(per_rank) >= 1:
            total = sum(per_rank)  # type: ignore[arg-type]
            dp = _count(info.get("dp_size")) or 1
            # One entry per DP rank (newer builds), or one entry standing for every rank.
            return total if len(per_rank) == dp else per_rank[0] * dp  # type: ignore[operator]
    argument = _count(info.get("max_running_requests"))
    if argument:
        return argument * (_count(info.get("dp_size")) or 1)
    return None


def capacity_from_loads(body) -> int | None:
    """The sum of `max_running_requests` over `/v1/loads` entries, where they carry it."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    values = [_count(entry.get("max_running_requests")) if isinstance(entry, dict) else None for entry in loads]
    return sum(values) if all(values) else None  # type: ignore[arg-type]


def load_from_loads(body) -> Load | None:
    """`/v1/loads` (`{"loads": [{num_running_reqs, num_waiting_reqs}, ...]}`) or the deprecated
    `/get_load` (`[{num_reqs, num_waiting_reqs}, ...]`, num_reqs counting both), summed over ranks."""
    if isinstance(body, dict) and isinstance(body.get("loads"), list):
        entries = [(_count(e.get("num_running_reqs")), _count(e.get("num_waiting_reqs")))
                   for e in body["loads"] if isinstance(e, dict)]
    elif isinstance(body, list):
        entries = []
        for e in body:
            total, waiting = (_count(e.get("num_reqs")), _count(e.get("num_waiting_reqs"))) \
                if isinstance(e, dict) else (None, None)
            entries.append((None if total is None or waiting is None else max(total - waiting, 0), waiting))
    else:
        return None
    if not entries or any(r is None or w is None for r, w in entries):
        return None
    return Load(sum(r for r, _ in entries), sum(w for _, w in entries))  # type: ignore[misc]


def load_from_meta(meta: dict) -> Load | None:
    """The scheduler's counts that 2026 SGLang copies into every answer's meta_info."""
    running, waiting = _count(meta.get("num_running_reqs")), _count(meta.get("num_waiting_reqs"))
    return None if running is None or waiting is None else Load(running, waiting)


def retarget(target: int, capacity: int | None, lowest_waiting: int, highest_waiting: int,
             highest_running: int, held_full: bool, bound: int) -> int:
    """The rule, on one window's extremes (see the module docstring)."""
    cap = capacity or max(target, 1)
    room = headroom(cap)
    if lowest_waiting > 2 * room:
        return clamp(target - math.ceil((lowest_waiting - room) / 2), bound)
    if held_full and highest_waiting == 0 and (capacity is None or highest_running < cap):
        grow = cap - highest_running if capacity else headroom(target)
        return clamp(target + grow, bound)
    return clamp(target, bound)


@dataclass
class Tuner:
    """One binding's target, and the extremes of the load seen since the last adjustment."""
    bound: int
    capacity: int | None = None
    target: int = 0
    _since: float | None = None
    _window: tuple[int, int, int] | None = None  # lowest waiting, highest waiting, highest running
    _held_full: bool = False

    def __post_init__(self) -> None:
        self.target = self.target or initial_target(self.capacity, self.bound)

    def reset(self, capacity: int | None) -> None:
        """A (re)started server: its capacity read again, the target from scratch."""
        self.capacity, self.target = capacity, initial_target(capacity, self.bound)
        self._window, self._since, self._held_full = None, None, False

    def observe(self, load: Load, in_flight: int, now: float) -> bool:
        """Note one load report (with this binding's in-flight count then); True when it moved the target."""
        if self._since is None:
            self._since = now
        low, high, running = self._window or (load.waiting, load.waiting, load.running)
        self._window = (min(low, load.waiting), max(high, load.waiting), max(running, load.running))
        self._held_full = self._held_full or in_flight >= self.target
        if now - self._since < WINDOW_SECONDS:
            return False
        before = self.target
        self.target = retarget(self.target, self.capacity, *self._window, self._held_full, self.bound)
        self._window, self._since, self._held_full = None, now, False
        return self.target != before
