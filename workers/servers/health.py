"""The background thread that keeps each server binding's state true.

Polls `GET /health` by status code on an interval; on the way to healthy (and
each time a server comes back) runs the preflight. State changes are logged
once, not on every poll; a server that stays unusable is said again now and then,
with how long and what it may mean (`waiting.py`: connection refused for long vs
503 while warming). A server goes down after `health_failures` failed probes in
a row and comes back after `health_successes` good ones, so one slow
answer neither drops a busy server nor readmits a flapping one; `observe` is
that state machine, apart from the HTTP that feeds it. A refused server (by
the preflight, or by `refuse` when `/generate` rejects the worker's
credentials) stays refused until it goes down and comes back.

Each preflight (a new server, or one back from a restart) sets the binding's
capacity afresh, and every round reads each usable server's live load
(`workers/servers/load.py`) for its in-flight tuner. A binding that is SGLang's
model gateway is probed with `GET /readiness` (its `/health` answers 200 with
no worker behind it; so is a binding not yet judged, which may be one), and its
worker list is read again each round: when the healthy workers change, the
preflight judges it again (capacity, context length, model). A gateway whose
`/readiness` says ready may still refuse every request (sglang-router answers
`503 No available workers` while its circuit breakers are open): a request
that gets that answer pauses the binding at once (`outage`), and a round that
finds it ready sends a one-token `/generate` as well when this worker has
nothing in flight there or the binding is not healthy, so the outage is seen
within the usual rounds and ends only once a request goes through. The probe
counts only the gateway's own outage answer as a failure: under load it may
wait behind the servers' queues, and a timeout says nothing. A binding whose answers do not
carry the whole server's load (a gateway, whose answers carry one worker's;
a server with several DP ranks) has its load read once per tuning window
(`capacity.WINDOW_SECONDS`) by a second thread as well, so that workers
sharing it see one another's requests within a second, not a health round.

A wedged server (its engine hung, its HTTP front still answering: `/health`
sends its head and then a byte now and then) is marked down within
`health_interval x health_failures + health_timeout` (plus a scheduling
delay) where `health_timeout <= health_interval`, as by default: every
request of this thread ends within `health_timeout` in all
(`workers/servers/reads.deadline_client`, not per read), rounds start every
`health_interval` however long the last one took (back to back if it took
longer, so with a longer timeout the bound is `health_timeout` per failure),
and a server's load is read only after a good probe. On that
transition to down, `cut` ends the requests still in flight there, so their
prompts go to another server instead of waiting out `FLEET_REQUEST_TIMEOUT`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import httpx

from ..reporting import lifeline
from .capacity import WINDOW_SECONDS
from .reads import deadline_client
from .gateway_answers import OUTAGE, gateway_failure
from .preflight import Unreadable, settle_context
from .preflight import preflight as preflight_server
from .load import gateway_load, gateway_workers, server_load
from .sglang_client import error_message
from .tls import why_untrusted
from .bindings import DOWN, HEALTHY, LOADING, REFUSED, WARMING, ServerBinding, ServerPool
from .waiting import WaitNotes
from ..settings import Settings

Preflight = Callable[[httpx.Client, ServerBinding], "int | None"]  # returns the server's capacity
Cut = Callable[[ServerBinding, str], int]  # ends the requests in flight on a server; how many

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(self, pool: ServerPool, settings: Settings, headers: dict[str, str],
                 after_round: Callable[[], None] | None = None, preflight: Preflight = preflight_server,
                 cut: Cut | None = None, waits: WaitNotes | None = None):
        self.pool = pool
        self.after_round = after_round
        self.preflight = preflight
        self.cut = cut
        self.settings = settings
        self.client = deadline_client(settings.health_timeout, headers, settings.keepalive_seconds)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=lifeline.guarded("health monitor", self._run), name="fleet-health",
                                        daemon=True)
        self._loads = threading.Thread(target=lifeline.guarded("load reader", self._read_loads),
                                       name="fleet-load", daemon=True)
        self._heartbeat = lifeline.Trouble("heartbeat to Redis")
        self._load_reads: dict[str, lifeline.Trouble] = {}
        self._waits = waits or WaitNotes()

    def start(self) -> None:
        self._thread.start()
        self._loads.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def refuse(self, binding: ServerBinding, why: str) -> None:
        """A request found the server wrongly configured (it refused our credentials): no more prompts
        for it until it goes down and comes back, when the preflight judges it again."""
        binding.refusal = binding.last_error = why
        if binding.state != REFUSED:
            log.error("server %s REFUSED: %s", binding.url, why)
        binding.state = REFUSED
        self.pool.changed()

    def outage(self, binding: ServerBinding, why: str) -> None:
        """A gateway answered a request that no worker can take: down now, as after the failed probes
        (its other requests in flight are left to finish), and back once a probe goes through."""
        binding.last_error = why
        binding.successes, binding.failures = 0, max(binding.failures, self.settings.health_failures)
        if binding.state == HEALTHY:
            binding.state = DOWN
            log.warning("server %s: healthy -> down (%s); prompts wait until a request goes through", binding.url,
                        why)
            self.pool.changed()

    def died(self, binding: ServerBinding, death: float, why: str) -> None:
        """A request here met the server's death (its connection closed with no answer, then nothing
        listened there: `crashes.py`): out of service now, whatever /health said meanwhile, so that it
        is back only through a preflight, after which its crash suspects probe first
        (`ServerBinding.held_for_probes`). A server started again faster than a health round (a
        supervisor's restart of a process that loads in a second) was otherwise never seen down: the
        worker held every other prompt for probes that had all come back, for good. Once a crash
        (`death`: its time): every request in flight there meets the same death."""
        if not self.pool.crashed(binding, death):
            return
        binding.last_error, binding.successes = why, 0
        if binding.state == HEALTHY:
            self._transition(binding, LOADING, why)  # not DOWN: its requests there died with it, none to cut
        self._wake.set()

    def wake(self) -> None:
        """Run a round (and write the heartbeat after it) now rather than at the next interval."""
        self._wake.set()

    def suspect(self, binding: ServerBinding, error: str) -> None:
        """A request failed to connect: check now rather than at the next interval."""
        binding.last_error = error
        self._wake.set()

    def check_all(self) -> None:
        threads = [threading.Thread(target=self.check, args=(b,)) for b in self.pool.bindings]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.pool.changed()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.check_all()
            if self.after_round:
                try:
                    self.after_round()
                    self._heartbeat.ok()
                except Exception as exc:  # Redis restarting: the next round writes again
                    self._heartbeat.failed(exc)
            self._wake.wait(max(0.0, started + self.settings.health_interval - time.monotonic()))
            self._wake.clear()

    def _read_loads(self) -> None:
        """Every window, the load of each usable binding whose answers do not carry it."""
        while not self._stop.wait(WINDOW_SECONDS):
            for binding in self.pool.bindings:
                if binding.usable and not binding.answers_carry_load:
                    self._read_load(binding, listing=False)  # the worker list: the health round's

    def check(self, binding: ServerBinding) -> None:
        observed, detail = self._probe(binding)
        binding.checked_at = time.time()
        self.observe(binding, observed, detail)
        still = self._waits.note(binding.url, binding.state, binding.last_error or detail)
        if still:  # a long wait says why again (`waiting.py`): a wrong port vs a model still loading
            log.warning("%s", still)
        if binding.usable and observed == HEALTHY:  # a failing server's load read would only wait too
            self._read_load(binding)
        elif binding.state == REFUSED and observed == HEALTHY and binding.gateway_workers is not None:
            self._recheck_refused_gateway(binding)

    def _read_load(self, binding: ServerBinding, listing: bool = True) -> None:
        """The server's running and waiting requests, for its tuner; a gateway's worker list first."""
        trouble = self._load_reads.setdefault(binding.url, lifeline.Trouble(f"server {binding.url}: load read"))
        try:
            if binding.gateway_workers is None:
                load = server_load(self.client, binding.url)
            else:
                workers = gateway_workers(self.client, binding.url) if listing else None
                if workers is not None and sorted(workers) != sorted(binding.gateway_workers):
                    self._workers_changed(binding, workers)
                load = gateway_load(self.client, binding.gateway_workers)
        except Exception as exc:  # never let a load read stop the health thread
            trouble.failed(exc)
            return
        trouble.ok()
        if load is not None:
            self.pool.observe_load(binding, load)

    def observe(self, binding: ServerBinding, observed: str, detail: str) -> None:
        """Apply one probe's outcome to the binding's state."""
        if observed == HEALTHY:
            binding.failures, binding.successes = 0, binding.successes + 1
            if binding.state != HEALTHY and binding.successes >= self.settings.health_successes:
                self._transition(binding, HEALTHY, "answers /health with 200")
                binding.preflighted = False
            if binding.state == HEALTHY and not binding.preflighted:
                self._preflight(binding)
            return
        binding.successes, binding.failures = 0, binding.failures + 1
        binding.last_error = detail
        first_look = binding.state not in (HEALTHY,)
        if first_look or binding.failures >= self.settings.health_failures:
            self._transition(binding, observed, detail)

    def _recheck_refused_gateway(self, binding: ServerBinding) -> None:
        """A refused gateway is judged again when its list changes (the server refused restarted,
        say): the gateway itself never goes down for that."""
        workers = gateway_workers(self.client, binding.url)
        if workers is not None and sorted(workers) != sorted(binding.gateway_workers or []):
            binding.state = HEALTHY
            self._workers_changed(binding, workers)

    def _workers_changed(self, binding: ServerBinding, workers: list[str]) -> None:
        """A gateway gained or lost healthy workers: judged again from the servers it lists now."""
        before = binding.gateway_workers or []
        log.warning("gateway %s: %d healthy workers (was %d)", binding.url, len(workers), len(before))
        binding.gateway_workers = workers
        self._preflight(binding)

    def _preflight(self, binding: ServerBinding) -> None:
        before = binding.refusal
        try:
            capacity = self.preflight(self.client, binding)
            settle_context(binding, self.settings.context_length)
        except httpx.HTTPError as exc:
            binding.preflighted = False
            binding.last_error = f"preflight failed: {exc!r}"
            log.warning("server %s: preflight failed (%r); will retry", binding.url, exc)
            self.pool.changed()
            return
        except Unreadable as exc:  # judged again each round: the servers may become reachable
            binding.preflighted = False
            if before != str(exc):  # once, not each round
                log.error("server %s gets no prompt: %s", binding.url, exc)
            binding.refusal = binding.last_error = str(exc)
            self.pool.changed()
            return
        self.pool.reset_capacity(binding, capacity)
        binding.preflighted = True
        binding.preflights += 1  # its runs' tokenizers are asked again (workers/servers/tokenizers.py)
        binding.ready_at = time.monotonic()
        binding.refused_runs.clear()
        if binding.refusal:
            if binding.state != REFUSED:
                log.error("server %s REFUSED: %s", binding.url, binding.refusal)
            binding.state = REFUSED
        else:
            note = f", reasoning_parser={binding.reasoning_parser} (noted: /generate output_ids stay raw)" \
                if binding.reasoning_parser else ""
            gateway = f", a gateway to {len(binding.gateway_workers)} healthy workers" \
                if binding.gateway_workers is not None else ""
            log.info("server %s ready: model=%s max_model_len=%s%s; capacity %s%s, so %d requests in "
                        "flight; it takes runs enqueued without --served-model or with --served-model %s",
                        binding.url, binding.model_path, binding.max_model_len, note,
                        binding.capacity or "not reported", gateway, binding.target,
                        " or ".join(sorted(binding.models())) or "?")
        self.pool.changed()

    def _probe(self, binding: ServerBinding) -> tuple[str, str]:
        url = binding.url
        maybe_gateway = binding.gateway_workers is not None or not binding.preflighted
        try:
            response = self.client.get(f"{url}/readiness") if maybe_gateway else None
            if response is None or response.status_code not in (200, 503):  # not a gateway (SGLang: 404,
                response = self.client.get(f"{url}/health")  # or 401 without its key), or an old router
        except httpx.ConnectError as exc:
            untrusted = why_untrusted(exc)
            if untrusted:  # said once, and no prompt goes there (nor a preflight) while it holds
                self.refuse(binding, untrusted)
                return REFUSED, untrusted
            return LOADING, (f"connection refused ({exc.__class__.__name__}): loading its model, or nothing "
                             "listens there")
        except httpx.ConnectTimeout:
            return DOWN, f"no connection within {self.settings.health_timeout:.0f}s: its host unreachable?"
        except httpx.TimeoutException:
            return DOWN, f"/health did not answer in full within {self.settings.health_timeout:.0f}s"
        except httpx.HTTPError as exc:
            return DOWN, f"/health failed: {exc!r}"
        if response.status_code == 200 and binding.gateway_workers is not None and binding.state != REFUSED and \
                (binding.state != HEALTHY or binding.in_flight == 0):
            refused = self._generation_probe(binding)
            if refused:
                return DOWN, refused
        if response.status_code == 200:
            return HEALTHY, ""
        if response.status_code == 503:
            return WARMING, "503 from /health: warming up, shutting down or stuck"
        return DOWN, f"/health answered HTTP {response.status_code}"

    def _generation_probe(self, binding: ServerBinding) -> str | None:
        """Why a gateway that says it is ready is not (its own outage answer to a one-token
        generation), or None: a generation, a server's error or no answer in time says nothing."""
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        try:
            response = self.client.post(f"{binding.url}/generate", json=body)
        except httpx.HTTPError:
            return None
        if gateway_failure(response.status_code, response.content) == OUTAGE:
            return (f"/readiness answers 200 but /generate HTTP {response.status_code} "
                    f"{error_message(response.content)}")
        return None

    def _transition(self, binding: ServerBinding, state: str, why: str) -> None:
        if state == binding.state or (binding.state == REFUSED and state == HEALTHY):
            return
        if binding.state == HEALTHY:  # a server lost: its prompts go elsewhere meanwhile
            log.warning("server %s: %s -> %s (%s); its new prompts go to this worker's other servers, or wait in "
                        "the queue; see the server's own log", binding.url, binding.state, state, why)
        else:
            log.info("server %s: %s -> %s (%s)", binding.url, binding.state, state, why)
        was = binding.state
        binding.state = state
        self.pool.changed()
        if was == HEALTHY and state == DOWN and self.cut is not None:
            # Only DOWN: a 503 (WARMING) is also a server draining after SIGTERM, which finishes them.
            cut = self.cut(binding, why)
            if cut:
                log.warning("server %s: %d requests in flight there cut; their prompts go to another "
                            "server or back to the queue", binding.url, cut)
