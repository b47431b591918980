"""Server bindings: the SGLang servers a worker sends to, and their true state.

Health is the HTTP status of `GET /health` (SGLang answers 200 with an empty
body, 503 while warming up, and refuses connections while loading), never its
body. A server that answers is then checked once before its first prompt
(preflight): the model it serves, whether it truncates prompts on its own, its
context length. A server that refuses the worker's credentials, at preflight or
on `/generate`, is refused until it goes down and comes back.

Routing picks, among the usable servers below their own in-flight target
(`workers/servers/capacity.py`: the server's running batch plus a short queue), the
least loaded (`affinity.load`: its requests as a share of its capacity, this
worker's in flight there plus the other clients' the server last reported),
so a batch-64 and a batch-256 server behind one worker each get their fill;
unless the prompt prefers a server (`workers/servers/affinity.py`: its conversation's
or its prefix's) whose load is within the margin of the least loaded's, which
it then takes, or waits for a slot there. A waiting thread waits on its
preferred server's condition (or on the pool's, without one), so a freed slot
wakes a thread that wants that server, else one that wants any, else one
whose preferred server is now beyond the margin. A preferred server this worker
has not judged yet (its first health checks and preflight still under way,
as right after a worker starts: the gate opens on the first usable server)
is waited for, up to `PENDING_WAIT` seconds from the pool's start, rather
than passed over: a restarted worker otherwise sent a conversation's next
turn to whichever server its health thread checked first (2 of 8
conversations moved in one CI run). A binding may be SGLang's model
gateway (`gateway_workers` set by the preflight): one server to the fleet,
whose capacity is the sum of its workers'.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from contract.redis_link.connections import redact_url
from contract.names import ServerState
from contract.counts import counted

from . import affinity
from .capacity import Load, Tuner, load_from_meta

log = logging.getLogger(__name__)

PENDING_WAIT = 15.0  # seconds after the pool's start that a prompt waits for its unjudged preferred server
PROBE_GRACE = 5.0  # seconds after a crashed server is back during which only crash suspects are sent there

UNKNOWN, LOADING, WARMING, HEALTHY = ServerState.UNKNOWN, ServerState.LOADING, ServerState.WARMING, ServerState.HEALTHY
DOWN, REFUSED = ServerState.DOWN, ServerState.REFUSED


@dataclass
class ServerBinding:
    url: str
    state: ServerState = UNKNOWN
    in_flight: int = 0
    failures: int = 0
    successes: int = 0
    model_path: str | None = None
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_input_len: int | None = None  # the scheduler's max_req_input_len, where reported
    reasoning_parser: str | None = None
    sglang_version: str | None = None  # /server_info's version (contract/fleet/provenance.py)
    weight_version: str | None = None  # /model_info's (or /server_info's) weight_version at the last preflight
    vocab_size: int | None = None  # where the server reports one
    refusal: str | None = None
    unread: str | None = None  # what the preflight could not read that the context length depends on
    last_error: str | None = None
    checked_at: float = 0.0
    preflighted: bool = False
    preflights: int = 0  # preflights passed: a new one is a (re)started server, whose verdicts are asked again
    refused_runs: dict[str, str] = field(default_factory=dict)  # run -> why its tokenizer is not the server's
    # this worker's crash suspects of this server (workers/intake/server_crashes.py): while any waits for its
    # probe, no other prompt of this worker is sent here, so each probe runs alone on the restarted server
    suspects: set[str] = field(default_factory=set)
    crashed_at: float | None = None  # monotonic: when a request here met the server's death, until probes are done
    death: float | None = None  # the last death noted here (wall clock, one per crash: `CrashWatch.crashed`)
    ready_at: float = 0.0  # monotonic: the last preflight passed (the server's start, as this worker saw it)
    sent: int = field(default=0)
    tuner: Tuner = field(default_factory=lambda: Tuner(bound=1024))
    gateway_workers: list[str] | None = None  # a model gateway: the workers it routes to
    dp_size: int = 1
    reported: tuple[int, float] | None = None  # others' requests the server last reported, when (monotonic)
    last_load: Load | None = None  # the server's last reported running and waiting counts
    meta_load_seen: bool = False  # an answer's meta_info carried the load (2026 main; 0.5.23 does not)

    @property
    def capacity(self) -> int | None:
        return self.tuner.capacity

    @property
    def target(self) -> int:
        return self.tuner.target

    @property
    def bound(self) -> int:
        return self.tuner.bound

    @property
    def sharers(self) -> int:
        return self.tuner.sharers

    @property
    def one_rank(self) -> bool:
        """A plain server with one DP rank: an answer's meta_info counts are the whole server's."""
        return self.gateway_workers is None and self.dp_size == 1

    @property
    def answers_carry_load(self) -> bool:
        """Its answers have been seen to carry the whole server's load, so `/v1/loads` need not be
        polled every window. Learned from the answers, never assumed: SGLang 0.5.23 (the release
        the fleet is tested with) puts no load in meta_info, only 2026 main builds do."""
        return self.one_rank and self.meta_load_seen

    @property
    def usable(self) -> bool:
        return self.state == HEALTHY and self.preflighted and self.refusal is None

    def held_for_probes(self, now: float) -> bool:
        """Whether this worker's other prompts wait while crash suspects probe here: from a death of the
        server until it is back, `PROBE_GRACE` seconds on (the suspects redelivered to this worker find
        it), and while any suspect has yet to probe."""
        if self.suspects:
            return True
        if self.crashed_at is None:
            return False
        if self.ready_at < self.crashed_at or now - self.ready_at < PROBE_GRACE:
            return True
        self.crashed_at = None
        return False

    @property
    def unjudged(self) -> bool:
        """Its first verdict still to come: never probed, or up but its preflight not yet done
        (a probe that fails at first look gives a verdict at once: `health.observe`)."""
        return self.refusal is None and not self.preflighted and self.state in (UNKNOWN, HEALTHY)

    def serves(self, model: str | None) -> bool:
        return model is None or model in (self.model_path, self.served_model_name)

    def models(self) -> set[str]:
        return {m for m in (self.model_path, self.served_model_name) if m}

    def snapshot(self) -> dict:
        keep = ("url", "state", "in_flight", "capacity", "target", "sharers", "model_path", "served_model_name",
                "max_model_len", "reasoning_parser", "refusal", "last_error", "checked_at", "sent",
                "sglang_version", "weight_version")
        found = {k: getattr(self, k) for k in keep}
        if self.gateway_workers is not None:
            found["gateway_workers"] = len(self.gateway_workers)
        if self.refused_runs:
            found["refused_runs"] = dict(self.refused_runs)
        return found


class NoServer(Exception):
    """No healthy server for this prompt's model came free in time."""


class Recheck(Exception):
    """A server became usable after the caller chose `only` among the usable ones: choose again."""


class ServerPool:
    """The bindings of one worker process, shared by its task threads."""

    def __init__(self, urls: list[str], max_inflight: int, margin: float = affinity.DEFAULT_MARGIN,
                 pending_wait: float = PENDING_WAIT):
        # Recorded redacted: credentials in a URL travel only in workers/servers/auth.py.
        # `max_inflight` (FLEET_MAX_INFLIGHT_PER_SERVER) bounds every binding's tuned target;
        # `margin` (FLEET_AFFINITY_MARGIN) is the load guard of a preferred server.
        self.bindings = [ServerBinding(redact_url(u), tuner=Tuner(bound=max_inflight)) for u in urls]
        self.margin = margin
        self._pending_until = time.monotonic() + pending_wait
        self._lock = threading.Lock()
        # Threads waiting for a slot: on their preferred server's condition, or on None's (any server).
        self._conds = {key: threading.Condition(self._lock) for key in [None, *(b.url for b in self.bindings)]}
        self._waiting = dict.fromkeys(self._conds, 0)

    def usable(self, model: str | None = None, only: frozenset[str] | None = None) -> list[ServerBinding]:
        """The usable servers of `model` (and, where `only` is given, among those URLs)."""
        return [b for b in self.bindings if b.usable and b.serves(model) and (only is None or b.url in only)]

    def healthy_models(self) -> set[str]:
        return set().union(*(b.models() for b in self.bindings if b.usable))

    def any_usable(self) -> bool:
        return any(b.usable for b in self.bindings)

    def spilled(self, prefer: str | None, chosen: ServerBinding, model: str | None) -> bool:
        """Whether the load guard sent a prompt to `chosen` though its preferred server could take it."""
        return prefer is not None and chosen.url != prefer and any(b.url == prefer for b in self.usable(model))

    @contextmanager
    def acquire(self, model: str | None, wait: float, avoid: str | None = None,
                prefer: str | None = None, only: frozenset[str] | None = None,
                suspect: bool = False, checked: frozenset[str] = frozenset(),
                lookup: Callable[[], str | None] | None = None,
                placed: Callable[[ServerBinding, str | None], None] | None = None) -> Iterator[ServerBinding]:
        """Hold a slot on the preferred server while the load guard allows it, else on the
        least-loaded usable server (among `only`, where given, chosen from the usable servers
        `checked`: `Recheck` when another has become usable; one whose crash suspects wait for
        their probes only for a `suspect`), waiting up to `wait` seconds.

        `lookup` (affinity's, `Affinity.prefer`) names the preferred server afresh at each pick,
        and `placed` is told the server chosen and the one preferred, both under the pool's lock:
        so of prompts that share a prefix and arrive together (the samples of one prompt), the
        second is picked after the first was placed, and follows it."""
        deadline = time.monotonic() + wait
        with self._lock:
            while True:
                wanted = (lookup() or prefer) if lookup is not None else prefer
                chosen, hold_for = self._pick(model, avoid, wanted, only, suspect, checked)
                if chosen:
                    if placed is not None:
                        placed(chosen, wanted)
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    refusing = len(self.usable(model)) - len(self.usable(model, only)) if only is not None else 0
                    why = f" ({refusing} refuse the run: see the log)" if refusing else ""
                    raise NoServer(f"no healthy server for model {model or 'any'}{why} within {wait:.0f}s")
                # Every change that can free a slot notifies (a release, a new target, each health
                # round): no timed re-check, which at 2,048 in flight woke ~500 waiters a second.
                self._waiting[hold_for] += 1
                try:
                    self._conds[hold_for].wait(left)
                finally:
                    self._waiting[hold_for] -= 1
            chosen.in_flight += 1
            chosen.sent += 1
        try:
            yield chosen
        finally:
            with self._lock:
                chosen.in_flight -= 1
                self._wake(chosen)

    def _pick(self, model: str | None, avoid: str | None, prefer: str | None,
              only: frozenset[str] | None = None, suspect: bool = False,
              checked: frozenset[str] = frozenset()) -> tuple[ServerBinding | None, str | None]:
        """(the server to take now, or None and the server whose slot to wait for: None for any);
        `Recheck` when a usable server is not among those `only` was chosen from (`checked`)."""
        now = time.monotonic()
        if prefer is not None and prefer != avoid and self._pending(prefer):
            return None, prefer
        usable = self.usable(model)
        if only is not None and any(b.url not in checked for b in usable):
            raise Recheck("a server became usable since the run's servers were checked")
        candidates = [b for b in usable if (only is None or b.url in only) and (suspect or not b.held_for_probes(now))]
        if only is not None and prefer not in only:
            prefer = None
        held = affinity.sticky(prefer, candidates, self.margin, avoid)
        if held is not None:
            return (held, None) if held.in_flight < held.target else (None, held.url)
        free = [b for b in candidates if b.in_flight < b.target]
        if not free:
            return None, None
        others = [b for b in free if b.url != avoid]  # least loaded as the guard counts load: others' requests too
        return min(others or free, key=lambda b: (affinity.load(b, now), b.in_flight / b.target, -b.target)), None

    def _pending(self, url: str) -> bool:
        """The preferred server is still being judged, early in this pool's life (see the module docstring)."""
        if time.monotonic() > self._pending_until:
            return False
        return any(b.url == url and b.unjudged for b in self.bindings)

    def _wake(self, freed: ServerBinding) -> None:
        """A slot came free on `freed`: wake one thread that wants it, else one that takes any
        server, else one holding out for a server now beyond the margin over this one."""
        for key in (freed.url, None):
            if self._waiting[key]:
                self._conds[key].notify()
                return
        spare = affinity.load(freed)
        for binding in self.bindings:
            if self._waiting[binding.url] and affinity.load(binding) - spare > self.margin:
                self._conds[binding.url].notify()
                return

    def _notify_all(self) -> None:
        for cond in self._conds.values():
            cond.notify_all()

    def targets(self) -> int:
        """Requests this worker means to keep in flight now, over its usable servers."""
        return sum(b.target for b in self.bindings if b.usable)

    def reset_capacity(self, binding: ServerBinding, capacity: int | None) -> None:
        """A (re)started server: its capacity as just read, its target from scratch."""
        with self._lock:
            binding.tuner.reset(capacity)
            binding.meta_load_seen = False  # another build may be listening now
            self._notify_all()

    def shared_by(self, counts: dict[str, int]) -> None:
        """The live workers bound to each server (`workers/servers/sharers.py`): sets the start's share."""
        with self._lock:
            moved = [b for b in self.bindings if b.url in counts and b.tuner.shared_by(counts[b.url])]
            for binding in moved:
                log.info("server %s: shared by %s, so %d in flight to start", binding.url,
                         counted(binding.sharers, "worker"), binding.target)
            if moved:
                self._notify_all()

    def observe_load(self, binding: ServerBinding, load: Load, now: float | None = None) -> None:
        """A load report for the whole server: may move its target (and wake threads waiting for room)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            binding.reported = (affinity.others(load.running, load.waiting, binding.in_flight), now)
            binding.last_load = load
            if binding.tuner.observe(load, binding.in_flight, now):
                log.info("server %s: %d in flight now (capacity %s, load %d running / %d waiting)",
                         binding.url, binding.target, binding.capacity, load.running, load.waiting)
                self._notify_all()

    def observe_answer(self, binding: ServerBinding, meta: dict) -> None:
        """The load a 2026 SGLang copies into each answer's meta_info, where it is the whole server's
        (SGLang 0.5.23 copies none: then the health thread reads `/v1/loads` every window)."""
        load = load_from_meta(meta) if binding.one_rank else None
        if load is not None:
            binding.meta_load_seen = True
            self.observe_load(binding, load)

    def free_slots(self) -> tuple[int, int]:
        """Free and total batch slots over the usable servers that report capacity and load
        (for the CPU-bound signal, `workers/servers/cpu_bound.py`)."""
        known = [b for b in self.bindings if b.usable and b.capacity and b.last_load is not None]
        return (sum(max(b.capacity - b.last_load.running, 0) for b in known),  # type: ignore[operator,union-attr]
                sum(b.capacity for b in known))  # type: ignore[misc]

    def crashed(self, binding: ServerBinding, death: float) -> bool:
        """A request here met the server's death (`death`: its time, the same for every request in
        flight there): its suspects probe first when it is back. False for a death noted already."""
        with self._lock:
            if binding.death == death:
                return False
            binding.death, binding.crashed_at = death, time.monotonic()
            return True

    def suspected(self, url: str, key: str) -> None:
        """A prompt of this worker was in flight when the server at `url` died: it probes first there."""
        with self._lock:
            for binding in self.bindings:
                if binding.url == url:
                    binding.suspects.add(key)

    def cleared(self, key: str) -> None:
        """A suspect probed, or left this worker: the servers it held back take other prompts again."""
        with self._lock:
            held = [b for b in self.bindings if key in b.suspects]
            for binding in held:
                binding.suspects.discard(key)
            if held:
                self._notify_all()

    def changed(self) -> None:
        with self._lock:
            self._notify_all()

    def snapshot(self) -> list[dict]:
        return [b.snapshot() for b in self.bindings]
