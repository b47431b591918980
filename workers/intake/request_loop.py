"""Requests until a server answers: the attempt loop of one prompt, and what each failure spends.

The loop lives in the task thread rather than in Celery retries: retries would go back through
the broker with an ETA (and its visibility-timeout pitfalls), while a loop here keeps the prompt
leased to this worker and can move it to another healthy server at once.

Every way round the loop spends a budget or shrinks the choice of servers (`answer`), so it
ends (besides a suspect's one-token probe, once, and a new choice when a server became usable
meanwhile): transient failures and bad answers spend `FLEET_MAX_ATTEMPTS`, a server's outage (no
connection, a dropped one, a gateway's upstream lost) `FLEET_MAX_UNAVAILABLE`, a refusal of our
credentials refuses that server, a cut follows its server's going down, an earlier request of
the prompt still running on the server is waited for up to `FLEET_REQUEST_TIMEOUT`, and no usable
server gives the prompt back to the queue. A prompt in flight when its server died is noted at the
crash (`server_crashes.py`), and goes alone next time.
"""
from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timezone
from typing import Callable

import redis

from contract.fleet.provenance import weight_version_of
from contract.names import Reason
from contract.ledger.deadletters import DeadLetter
from contract.run.spec import RunSpec

from ..reporting import metrics
from ..servers import cache_hits
from ..servers.affinity import NO_ROUTE, Route
from ..servers.answers import BadOutput, answer_cap, id_bound
from ..servers.bindings import NoServer, Recheck, ServerBinding
from ..servers.server_info import credentials_refusal
from ..servers.sglang_client import (GatewayOutage, Generation, InFlightThere, ServerCut, ServerDropped,
                                     ServerRefused, ServerRejected, ServerUnavailable, TransientError, generate)
from . import deliveries, server_crashes
from .attempts import Attempts, GiveBack, SettledElsewhere, Unfit
from .burial import dead_letter
from .runtime import Runtime

log = logging.getLogger(__name__)


def answer(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
           tries: Attempts, route: Route = NO_ROUTE) -> Generation:
    """Requests until a server answers (what each failure spends: the module's docstring). Raises
    `Unfit` when the prompt ends as a dead letter, `GiveBack` when no usable server is left,
    `SettledElsewhere` when another worker stored or buried it meanwhile. `route` names the server
    the prompt's prefix is cached on, which it takes while the load guard allows
    (`workers/servers/affinity.py`)."""
    key = server_crashes.suspect_key(spec.name, prompt_id)
    if tries.crashes and not tries.probed:  # noted at a crash (here or by another worker): it probes first
        rt.pool.suspected(tries.crashes[-1]["server"], key)
    try:
        return _requests(rt, spec, prompt_id, prompt_ids, sampling, tries, route)
    finally:
        rt.pool.cleared(key)  # no longer a suspect of this worker's


def _requests(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
              tries: Attempts, route: Route) -> Generation:
    s = rt.settings
    while True:
        avoid = tries.servers[-1] if tries.servers else None
        tries.alone = False
        usable = rt.pool.usable(spec.served_model)
        taking = rt.tokenizers.taking(spec, usable)  # asks the servers not asked yet
        suspect = bool(tries.crashes) and not tries.probed
        try:
            with rt.pool.acquire(spec.served_model, s.server_wait, avoid=avoid, prefer=route.prefer,
                                 only=taking, suspect=suspect, checked=frozenset(b.url for b in usable),
                                 lookup=lambda: rt.affinity.prefer(route),
                                 placed=lambda chosen, wanted: rt.affinity.sent(
                                     route, chosen.url, rt.pool.spilled(wanted, chosen, spec.served_model))) as binding:
                too_long = prompt_too_long(len(prompt_ids), binding.max_model_len, binding.max_input_len)
                if too_long:
                    raise Unfit(dead_letter(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.PROMPT_TOO_LONG,
                                            f"{too_long} of {binding.url}"))
                tries.servers.append(binding.url)
                sent = fit_context(sampling, len(prompt_ids), binding.max_model_len)
                if suspect:  # a one-token probe alone, then back to the pool as any prompt
                    _alone(rt, binding, tries, lambda: _send(rt, spec, binding, prompt_id, prompt_ids,
                                                              {**sent, "max_new_tokens": 1}))
                    tries.probed = True
                    tries.servers.pop()  # a probe, not an attempt
                    rt.pool.cleared(server_crashes.suspect_key(spec.name, prompt_id))  # the others may go there
                    log.info("prompt %s of run %s: its one-token probe on %s came back; sent as usual now",
                             prompt_id, spec.name, binding.url)
                    continue
                send = lambda: _send(rt, spec, binding, prompt_id, prompt_ids, sent)  # noqa: E731
                alone = len(tries.crashes) >= server_crashes.WHOLE_ALONE
                generation = _alone(rt, binding, tries, send) if alone else send()
                rt.pool.observe_answer(binding, generation.meta_info)  # the server's load, for its tuner
                cache_hits.observe(binding.url, len(prompt_ids), generation.cached_tokens)
                _note_origin(rt, spec, binding, generation)
                return generation
        except Recheck:  # a server came up meanwhile: ask it for the run's tokenizer first
            continue
        except (NoServer, server_crashes.SoloBusy) as exc:
            raise GiveBack(str(exc)) from exc
        except ServerRejected as exc:
            raise Unfit(dead_letter(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.SERVER_REJECTED,
                                    str(exc))) from exc
        except ServerRefused as exc:
            _refused(rt, spec, binding, exc, tries)
        except ServerCut as exc:
            if tries.alone:  # a dying server may hang before its port closes: the health monitor cut it
                _dropped(rt, spec, binding, prompt_id, prompt_ids, sampling, tries, time.monotonic(),
                         within=server_crashes.CUT_CONFIRM_SECONDS)
            _cut(rt, spec, exc, tries)
        except GatewayOutage as exc:
            _outage(rt, spec, binding, exc, tries)
        except ServerUnavailable as exc:
            if isinstance(exc, ServerDropped):
                _dropped(rt, spec, binding, prompt_id, prompt_ids, sampling, tries, time.monotonic())
            rt.monitor.suspect(binding, str(exc))
            tries.last_bad_output = None
            if not _pause(tries, str(exc), 0.5, 5.0, transient=False, limit=s.max_unavailable):
                raise Unfit(_server_error(rt, spec, prompt_id, prompt_ids, sampling, tries)) from exc
        except (TransientError, BadOutput) as exc:
            if isinstance(exc, InFlightThere) and _waited_for_earlier(tries, str(exc), s.request_timeout):
                _unless_settled(rt, spec.name, prompt_id)
                continue
            bad = isinstance(exc, BadOutput)
            tries.last_bad_output = {**exc.excerpt, "server": binding.url} if bad else None
            error = f"{binding.url}: bad output: {exc}" if bad else str(exc)
            if not _pause(tries, error, s.retry_backoff, s.retry_backoff_max, transient=True,
                          limit=s.max_attempts):
                raise Unfit(_server_error(rt, spec, prompt_id, prompt_ids, sampling, tries)) from exc


def _send(rt: Runtime, spec: RunSpec, binding: ServerBinding, prompt_id: str, prompt_ids: list[int],
          sent: dict) -> Generation:
    s = rt.settings
    with metrics.LATENCY.labels(binding.url).time():
        return generate(rt.http, binding.url, prompt_ids, sent, prompt_id, timeout=s.request_timeout,
                        max_bytes=answer_cap(sent.get("max_new_tokens"), s.max_answer_bytes, spec.logprobs),
                        id_bound=id_bound(spec.vocab_size, binding.vocab_size), logprobs=spec.logprobs)


def _alone(rt: Runtime, binding: ServerBinding, tries: Attempts, send: Callable[[], Generation]) -> Generation:
    """A crash suspect's request, sent while it holds its server's solo slot (server_crashes.py)."""
    with server_crashes.solo(rt.redis, binding.url, rt.worker, rt.settings.server_wait):
        if not binding.usable:  # it went down while this prompt waited for the slot: not sent
            raise ServerCut(f"{binding.url}: not sent, the server went down while it waited to go alone")
        tries.alone = True  # read (and reset) by `_dropped` if the server dies of it, else by the next request
        generation = send()
    tries.alone = False
    return generation


def _dropped(rt: Runtime, spec: RunSpec, binding: ServerBinding, prompt_id: str, prompt_ids: list[int],
             sampling: dict, tries: Attempts, dropped: float, within: float | None = None) -> None:
    """The server closed this prompt's connection with no answer: if it died, the prompt is noted at
    the crash, and one that has now died alone `SOLO_DEATHS` times is its cause (`Unfit`, server_crash)."""
    alone, tries.alone = tries.alone, False
    at = rt.crash_watch.crashed(binding.url, dropped, within) if binding.gateway_workers is None else None
    if at is None:
        return
    tries.crashes = server_crashes.note(rt.redis, spec.name, prompt_id, tries.crashes, binding.url, at, alone)
    tries.probed = False
    rt.monitor.died(binding, at, "it died with requests in flight: their connections closed with no answer, "
                                 "then nothing listened there")
    when = datetime.fromtimestamp(at, timezone.utc)
    if server_crashes.convicted(tries.crashes):
        crashes = ", ".join(f"{c['server']} at {datetime.fromtimestamp(c['at'], timezone.utc):%H:%M:%S} UTC"
                            for c in tries.crashes)
        letter = dead_letter(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.SERVER_CRASH,
                             f"its server died each time it was in flight, the last "
                             f"{server_crashes.SOLO_DEATHS} times sent there alone ({crashes}); never sent again",
                             excerpt={"crashes": tries.crashes})
        letter.servers = sorted({c["server"] for c in tries.crashes})
        raise Unfit(letter)
    rt.pool.suspected(binding.url, server_crashes.suspect_key(spec.name, prompt_id))
    log.warning("prompt %s of run %s was in flight on %s when it died at %s UTC (crash %d of this prompt%s); "
                "it goes alone next time, to see whether it kills its server", prompt_id, spec.name, binding.url,
                f"{when:%H:%M:%S}", len(tries.crashes), ", sent alone" if alone else "")


def _refused(rt: Runtime, spec: RunSpec, binding: ServerBinding, exc: ServerRefused,
             tries: Attempts) -> None:
    """The server refused our credentials on /generate: refuse it, and try another server (return)
    or give the prompt back (raise), without spending its budget (the prompt is not at fault)."""
    rt.monitor.refuse(binding, credentials_refusal(exc.status, "/generate", rt.settings.sglang_api_key is not None))
    tries.refused += 1
    if not rt.pool.usable(spec.served_model) or tries.refused >= len(rt.pool.bindings):
        raise GiveBack(f"{exc}; no other usable server")


def _cut(rt: Runtime, spec: RunSpec, exc: ServerCut, tries: Attempts) -> None:
    """The server was marked down while this request waited there (a wedged engine): the request
    was no attempt (it is taken off the prompt's list and spends no budget), and the prompt goes
    to another server at once, or back to the queue when none is usable."""
    tries.servers.pop()
    tries.cut += 1
    log.info("%s; trying another server", exc)
    if not rt.pool.usable(spec.served_model):
        raise GiveBack(f"{exc}; no other usable server")


def _outage(rt: Runtime, spec: RunSpec, binding: ServerBinding, exc: GatewayOutage, tries: Attempts) -> None:
    """The gateway answered that no worker can take a request: the binding is paused like a server
    that is down (health brings it back once a request goes through), the request was no attempt,
    and the prompt goes to another server at once, or back to the queue when none is usable."""
    rt.monitor.outage(binding, str(exc))
    tries.servers.pop()
    tries.cut += 1
    if not rt.pool.usable(spec.served_model):
        raise GiveBack(f"{exc}; no other usable server")


def _pause(tries: Attempts, error: str, base: float, cap: float, *, transient: bool,
           limit: int) -> bool:
    """Count a failed request and sleep with full jitter; False (no sleep) once the budget is spent."""
    tries.last_error = error
    if transient:
        tries.transient += 1
        count = tries.transient
    else:
        tries.unavailable += 1
        count = tries.unavailable
    if count >= limit:
        return False
    metrics.RETRIES.labels("transient" if transient else "unavailable").inc()
    time.sleep(random.uniform(0, min(cap, base * 2 ** (count - 1))))
    return True


def _waited_for_earlier(tries: Attempts, error: str, longest: float) -> bool:
    """An earlier request for the prompt still runs on the server (`InFlightThere`): waited for a
    few seconds, spending no attempt, for as long as one request may run (`FLEET_REQUEST_TIMEOUT`,
    from the first such answer); False past it, when the answer counts as a transient failure. A
    worker that takes over a prompt from one cut off from Redis meets this while the other's
    generation goes on: counted as failures, five answers in ten seconds dead-lettered it."""
    now = time.monotonic()
    if tries.in_flight_since is None:
        tries.in_flight_since = now
    if now - tries.in_flight_since > longest:
        return False
    tries.last_error = error
    metrics.RETRIES.labels("in_flight").inc()
    time.sleep(random.uniform(1.0, 3.0))
    return True


def _unless_settled(rt: Runtime, run: str, prompt_id: str) -> None:
    """Raises `SettledElsewhere` where the ledger says the prompt is done or dead after such a wait.
    The worker that meets an earlier request of its prompt has taken it over from one that froze past
    its lease, or is that frozen worker, thawed mid-wait after the taker stored it: its next try would
    find the server free of the earlier request and generate the prompt once more, for nothing."""
    if state := deliveries.settled(rt.redis, run, prompt_id):
        raise SettledElsewhere(state)


def _server_error(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int],
                  sampling: dict, tries: Attempts) -> DeadLetter:
    """The budget is spent: `bad_output` when the last answer was a bad one, else `server_error`."""
    message = f"gave up after {tries.total} requests; last error: {tries.last_error}"
    reason = Reason.SERVER_ERROR if tries.last_bad_output is None else Reason.BAD_OUTPUT
    return dead_letter(rt, spec, prompt_id, prompt_ids, sampling, tries, reason, message,
                       excerpt=tries.last_bad_output)


def prompt_too_long(prompt_len: int, context: int | None, max_input: int | None) -> str | None:
    """Why SGLang would refuse this prompt, or answer it with nothing, whatever its budget; or None.
    SGLang 0.5.23's scheduler answers at most `context - 2 - prompt` tokens (its `max_req_len`,
    context - 1, less the prompt and one), so a prompt of context - 2 tokens or more gets no
    answer, and it refuses a prompt of `max_req_input_len` tokens or more (context - 6 there)."""
    if context and prompt_len >= context - 2:
        return f"{prompt_len} prompt tokens leave no room for an answer in the context of {context} tokens"
    if max_input and prompt_len >= max_input:
        return f"{prompt_len} prompt tokens reach the longest input allowed, {max_input} tokens (max_req_input_len)"
    return None


def fit_context(sampling: dict, prompt_len: int, context: int | None) -> dict:
    """The budget cut to what SGLang answers at most, `context - 2 - prompt` tokens (its scheduler
    caps it there without a word; 0.5.23 refuses with a 400 only a prompt plus budget above the
    context), so the sample records the budget that applied. Behind a gateway a 400 would also
    open its circuit breakers."""
    most = context - prompt_len - 2 if context else None
    if most is not None and sampling.get("max_new_tokens", 0) > most:
        return {**sampling, "max_new_tokens": most}
    return sampling


def _note_origin(rt: Runtime, spec: RunSpec, binding: ServerBinding, generation: Generation) -> None:
    """The run's provenance: this server, its SGLang version and model, and the weights that made the
    answer, noted once per (run, server, weight version) a worker sees (`contract/fleet/provenance.py`),
    and written once the sample has joined its shard's group (`generation._commit`) or is
    dead-lettered, never on its way there (a Redis that takes no writes would hold it back from its
    group)."""
    version = weight_version_of(generation.meta_info, binding.weight_version)
    rt.provenance.observe(spec.name, binding.url, version, binding.sglang_version, binding.model_path,
                          binding.served_model_name)


def record_origins(rt: Runtime, run: str) -> None:
    """Write the origins noted so far; a failure is tried again after the next sample."""
    try:
        rt.provenance.flush(rt.redis)
    except redis.RedisError as exc:
        log.debug("run %s: provenance not recorded yet (%r)", run, exc)

