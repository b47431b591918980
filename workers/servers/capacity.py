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
`Tuner.observe` applies the rule once per window, on the window's extremes so
that one answer's momentary gap moves nothing, and by this binding's share of
the server's requests (its in-flight count over the server's running +
waiting, averaged over the window), so that several workers filling one
server move together by the excess or the free slots once, rather than each
by all of it (which made three workers on one server drop to one request
each, then climb back):
- the queue stayed longer than twice the headroom (its shortest length in the
  window): the target becomes this binding's share of what the server should
  hold, the batch it ran plus the headroom (never more than it was), once
  the binding holds no more than its target (a queue it built before its
  last shrink, still draining, would shrink it again, and the sharers
  unevenly);
- the server never queued anything and never ran a full batch while this
  binding held its whole target, and the server counted (within the
  headroom) every request this binding had sent: grow by its share of the
  free slots (by an eighth of the target where the capacity is unknown). A
  binding whose requests the server has not seen yet (a gateway still
  forwarding a burst) would only add to the burst.
- the server ran full with a short queue the whole window, and other workers
  share it (`even_out`): a binding below its equal part (capacity + headroom
  over the sharers) that held its whole target takes its part; one above it,
  while the others hold at least theirs, gives back its excess over what they
  leave of capacity + headroom. A worker whose sharers are idle keeps their
  slots.
Moving every sharer by the same factor keeps equal targets equal, so workers
that start together finish equal shares.
A binding starts at its share of capacity + headroom: that over the number of
live workers bound to the same URL (`sharers`, counted in Redis each health
round: `workers/servers/sharers.py`), and follows that count until the load has first
moved its target. Four workers bound to one gateway that each started at the
whole capacity + headroom sent four times what the servers run before any of
them saw the others' load: a queue of ~450 on 128 slots that drained for
most of a 640-prompt run, unevenly over the gateway's two servers (0.898 of
the ideal client).
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


def initial_target(capacity: int | None, bound: int, sharers: int = 1) -> int:
    """Capacity + headroom (unknown capacity: `UNKNOWN_CAPACITY`), split over the workers sharing it."""
    cap = capacity or UNKNOWN_CAPACITY
    return clamp(math.ceil((cap + headroom(cap) if capacity else cap) / max(1, sharers)), bound)


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
             highest_running: int, held_full: bool, bound: int, share: float = 1.0, settled: bool = True,
             sharers: int = 1, others: float = 0.0) -> int:
    """The rule, on one window's extremes and this binding's share of the server (see the module docstring).
    `others`: the requests on the server that were not this binding's, averaged over the window."""
    cap = capacity or max(target, 1)
    room = headroom(cap)
    share = min(max(share, 0.0), 1.0)
    if lowest_waiting > 2 * room:
        if not settled:  # its last shrink has not taken effect yet
            return clamp(target, bound)
        return clamp(min(target, math.ceil(share * (min(cap, highest_running or cap) + room))), bound)
    if lowest_waiting > 0 and sharers > 1 and capacity:
        return clamp(even_out(target, cap, room, held_full, settled, sharers, others), bound)
    if held_full and highest_waiting == 0 and (capacity is None or highest_running < cap):
        grow = math.ceil((cap - highest_running) * share) if capacity else headroom(target)
        return clamp(target + grow, bound)
    return clamp(target, bound)


def even_out(target: int, cap: int, room: int, held_full: bool, settled: bool, sharers: int,
             others: float) -> int:
    """A full server with a short queue, shared: equal parts where every sharer wants one.
    Below its part (capacity + headroom over the sharers) a binding that held its whole target takes
    it; above it, one whose sharers hold at least theirs gives back what they hold beyond the
    server's capacity + headroom. Without this, targets that one window's timing had set apart
    stayed apart (a short queue moves nothing else): four workers on a gateway stored 135 to 194."""
    part = math.ceil((cap + room) / sharers)
    if target < part and held_full:
        return part
    if target > part and settled and others >= (sharers - 1) * part - room:
        return max(part, math.ceil(cap + room - others))
    return target


@dataclass
class Tuner:
    """One binding's target, and the extremes of the load seen since the last adjustment."""
    bound: int
    capacity: int | None = None
    target: int = 0
    _since: float | None = None
    _window: tuple[int, int, int] | None = None  # lowest waiting, highest waiting, highest running
    _held_full: bool = False
    _shares: tuple[float, int] = (0.0, 0)  # this binding's share of the server's requests: sum, samples
    _others: float = 0.0  # the others' requests on the server, summed over the window's samples
    _settled: bool = False  # held no more than its target at some point of the window
    sharers: int = 1  # live workers bound to this server's URL, this one included
    _moved: bool = False  # the load has moved the target since the last reset

    def __post_init__(self) -> None:
        self.target = self.target or initial_target(self.capacity, self.bound, self.sharers)

    @property
    def room(self) -> int:
        return headroom(self.capacity or max(self.target, 1))

    def reset(self, capacity: int | None) -> None:
        """A (re)started server: its capacity read again, the target from scratch."""
        self.capacity, self.target = capacity, initial_target(capacity, self.bound, self.sharers)
        self._moved, self._others = False, 0.0
        self._window, self._since, self._held_full, self._shares, self._settled = None, None, False, (0.0, 0), False

    def shared_by(self, sharers: int) -> bool:
        """The live workers bound to this server now; True when it moved a target the load has not
        moved yet (after that, each worker's share of the load does the job)."""
        self.sharers = max(1, sharers)
        if self._moved:
            return False
        before, self.target = self.target, initial_target(self.capacity, self.bound, self.sharers)
        return self.target != before

    def observe(self, load: Load, in_flight: int, now: float) -> bool:
        """Note one load report (with this binding's in-flight count then); True when it moved the target."""
        if self._since is None:
            self._since = now
        low, high, running = self._window or (load.waiting, load.waiting, load.running)
        self._window = (min(low, load.waiting), max(high, load.waiting), max(running, load.running))
        # Held its whole target, and the server counted what it sent (a few in transit aside).
        seen = in_flight - (load.running + load.waiting) <= self.room
        self._held_full = self._held_full or (in_flight >= self.target and seen)
        self._settled = self._settled or in_flight <= self.target
        # The server counts this binding's requests among its own (a request in transit not yet: at most 1).
        total, count = self._shares
        self._shares = (total + min(in_flight / max(load.running + load.waiting, 1), 1.0), count + 1)
        self._others += max(load.running + load.waiting - in_flight, 0)
        if now - self._since < WINDOW_SECONDS:
            return False
        before, share = self.target, self._shares[0] / self._shares[1]
        others = self._others / self._shares[1]
        self.target = retarget(self.target, self.capacity, *self._window, self._held_full, self.bound, share,
                               self._settled, self.sharers, others)
        self._others = 0.0
        self._window, self._since, self._held_full, self._shares, self._settled = None, now, False, (0.0, 0), False
        self._moved = self._moved or self.target != before
        return self.target != before
