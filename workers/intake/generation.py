"""One prompt, from token ids to a durable sample or a dead letter.

The attempt loop lives here rather than in Celery retries: retries would go
back through the broker with an ETA (and its visibility-timeout pitfalls),
while a loop in the task thread keeps the prompt leased to this worker and can
move it to another healthy server at once.

What is sent is decided once per prompt (`request_sampling`): the run's
sampling with the keys of the line's own `sampling` over it (read from the run's
line records only in a run that has them, `line_record`), the seed as
`sampling_seed`, and a requeue's budget over both; the row records what was
sent, so a reader never has to know which line said what. A `--logprobs K`
run's log-probabilities come with the answer, checked against its ids
(`answers.read_logprobs`), into their own columns.

Storage is never the prompt's fault: a prompt taken while the output storage
fails goes back to the queue before it is generated, a finished sample waits
for its shard while the writer retries, and a wait that outlasts
`FLEET_SHARD_COMMIT_TIMEOUT` gives the prompt back (its sample withdrawn)
rather than dead-lettering it. Only a sample the shard schema cannot hold
(`BadSample`) is the prompt's own `bad_output`.

In a run with a verifier (`enqueue --verify`), a sample that passed the think
checks has its answer checked before it goes to its shard (`output/verdicts.py`):
pass or fail, it is stored, with its verdict.

**One prompt, or one sample of it.** In a run of several samples a prompt
(`enqueue --samples N`) a message names one sample by its ledger key
(`<id>~<index>`, `contract/run/samples.py`): everything here keys by that, and only
the request's `sampling_seed` and the row's `id`, `sample` and `seed` are
derived from it (`request_sampling`, `_row`). Every request of a run of several
samples carries its `sampling_seed` (as does one whose line gives a seed), so a
re-run, a retry or a redelivery asks the server for the same sample; a run of
one sample sends none, so a server older than the key still takes it.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import time
from concurrent.futures import Future, TimeoutError as CommitTimeout
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import redis

from ..servers import cache_hits
from ..reporting import metrics
from contract.ledger.codec import b64_to_ids, ids_to_b64
from contract.chat.conversations import split_turn_id
from contract.run.line_fields import LineFields
from contract.run.line_sampling import line_seed, merged
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.names import PromptState, Reason
from contract.fleet.provenance import weight_version_of
from contract.redis_link.replication import expected, replicated, written_again
from contract.run.samples import resample_seed, sample_seed, split_sample_key
from contract.storage.schema import Sample
from contract.run.spec import RunSpec

from ..servers.affinity import NO_ROUTE, Route
from ..servers.answers import BadOutput, answer_cap, id_bound
from ..servers.server_info import credentials_refusal
from .runtime import Runtime
from ..servers.bindings import NoServer, Recheck, ServerBinding
from . import chains, deliveries, server_crashes
from .specs import cached_spec
from ..output.shards import BadSample, StorageUnavailable
from ..servers.sglang_client import (GatewayOutage, Generation, InFlightThere, ServerCut, ServerDropped,
                                     ServerRefused, ServerRejected, ServerUnavailable, TransientError, generate)
from ..output.turns import turn_columns
from ..output.verify import Verdict, think_positions, verify
from ..output.verdicts import verdict_of
from contract.run.verifiers import verdict_class

log = logging.getLogger(__name__)


Submit = Callable[[str, Sample], Future]  # hands a run's sample to the shard writer


class GiveBack(Exception):
    """No healthy server came free: the prompt goes back to the queue untouched."""


class SettledElsewhere(Exception):
    """While this worker waited for an earlier request of the prompt still running on its server,
    another worker settled the prompt (its args: the state, done or dead): nothing is sent again."""


@dataclass
class Attempts:
    """What happened to one prompt so far, for its sample or dead letter."""
    transient: int = 0
    unavailable: int = 0
    refused: int = 0
    cut: int = 0  # requests ended because their server was marked down: not attempts
    last_bad_output: dict | None = None  # the excerpt, when the last failure was a bad answer
    resampled: bool = False
    crashes: list[dict] = field(default_factory=list)  # server crashes it was in flight at (server_crashes.py)
    probed: bool = False  # sent alone as a one-token probe since its last crash note, and answered
    alone: bool = False   # the request in flight is a crash suspect's, sent alone
    servers: list[str] = field(default_factory=list)
    last_error: str = ""
    started_at: float = field(default_factory=time.time)
    in_flight_since: float | None = None  # monotonic: the first answer that an earlier request still runs

    @property
    def total(self) -> int:
        return len(self.servers)


def process_prompt(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int],
                   max_new_tokens: int | None, submit: Submit) -> str:
    """Generate, verify and store one prompt (its sample handed to the shard writer through
    `submit`); returns where it ended up."""
    _check_storage(rt, prompt_id)
    # the line's own sampling and what a verifier reads of it, read before the generation: Redis
    # failing now costs none
    line = line_record(rt, spec, prompt_id)
    sampling = request_sampling(spec, prompt_id, line, max_new_tokens)
    fields = line.get("fields") or {}
    tries = Attempts(crashes=server_crashes.notes(rt.redis, spec.name, prompt_id))
    if spec.vocab_size and prompt_ids and max(prompt_ids) >= spec.vocab_size:  # never sent: it may kill a server
        return bury(rt, _dead(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.WORKER_ERROR,
                              f"prompt id {max(prompt_ids)} is not a token id of the run's tokenizer "
                              f"({spec.vocab_size} ids); not sent"))
    route = rt.affinity.route(rt.redis, spec.name, spec.turns == "all", prompt_id, prompt_ids)
    try:
        return _generate_and_settle(rt, spec, prompt_id, prompt_ids, sampling, tries, route, submit, fields)
    finally:
        _record_origins(rt, spec.name)  # the servers' versions its answers came with (a dead letter's too)


def _generate_and_settle(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
                         tries: Attempts, route: Route, submit: Submit, fields: dict) -> str:
    """Requests until an answer passes the think checks (stored) or the prompt ends as a dead letter."""
    try:
        while True:
            generation = _generation(rt, spec, prompt_id, prompt_ids, sampling, tries, route)
            verdict = verify(generation.output_ids, generation.meta_info, len(prompt_ids), spec)
            if verdict.ok:
                return _store(rt, spec, prompt_id, prompt_ids, tries, generation, verdict, submit, fields)
            if rt.settings.resample_on_verify_failure and not tries.resampled:
                tries.resampled = True
                sampling = _resampling(sampling)
                continue
            metrics.VERIFY_FAILURES.labels(verdict.reason).inc()
            raise Unfit(_dead(rt, spec, prompt_id, prompt_ids, generation.sampling, tries,
                              verdict.reason, verdict.message, generation))
    except Unfit as exc:
        return bury(rt, exc.letter)


def _resampling(sampling: dict) -> dict:
    """A resample's sampling: another seed where the failed request had one (`resample_seed`)."""
    if "sampling_seed" not in sampling:
        return sampling
    return {**sampling, "sampling_seed": resample_seed(sampling["sampling_seed"])}


def line_record(rt: Runtime, spec: RunSpec, key: str) -> dict:
    """What the producer recorded of the prompt's line (`contract/run/line_fields.py`): read only in a run
    whose spec says its lines carry some, so any other run pays no read. `key` is the ledger's (a
    sample's, `<id>~<index>`, in a run of several samples); a conversation's line is its own."""
    if not spec.line_fields:
        return {}
    line_id, _ = split_sample_key(key, spec.samples)
    if spec.turns == "all":
        line_id = split_turn_id(line_id)[0]
    return LineFields(rt.redis, spec.name).get(line_id)


def request_sampling(spec: RunSpec, key: str, line: dict, max_new_tokens: int | None = None) -> dict:
    """The `sampling_params` a prompt is sent with: the run's, each key the line's own `sampling`
    gives replaced by the line's (contract/run/line_sampling.py), and the budget a requeue gave
    (`max_new_tokens`) over both. A seed goes as `sampling_seed`: the line's for its first
    sample, and one per sample in a run of several (`contract.run.samples.sample_seed`)."""
    own = line.get("sampling")
    sampling = merged(spec.sampling, own)
    prompt_id, index = split_sample_key(key, spec.samples)
    if line_seed(own) is not None or spec.samples > 1:
        sampling["sampling_seed"] = sample_seed(spec.name, prompt_id, index, line_seed(own))
    if max_new_tokens:
        sampling["max_new_tokens"] = max_new_tokens
    return sampling


class Unfit(Exception):
    """The prompt ends as this dead letter (raised out of the request loop, buried by its caller)."""

    def __init__(self, letter: DeadLetter):
        super().__init__(f"{letter.reason}: {letter.message}")
        self.letter = letter


class Buried(str):
    """What a task returns for a prompt it dead-lettered: the task raises `DeadLettered`
    from it, so Flower and Celery's events show the prompt as failed with its reason."""

    def __new__(cls, letter: DeadLetter) -> "Buried":
        buried = super().__new__(cls, f"dead: {letter.reason}")
        buried.reason, buried.message = str(letter.reason), letter.message
        return buried


class DeadLettered(Exception):
    """A task's failure that Celery must not retry: the prompt is in the dead-letter queue.
    Its args are its constructor's, so Celery's pickle check keeps it as itself (an expected
    failure, in the task's `throws`) rather than wrapping it as an unexpected one."""

    def __init__(self, reason: str, message: str):
        super().__init__(reason, message)
        self.reason, self.message = reason, message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    def __repr__(self) -> str:  # what Flower shows of a failed task
        return f"{type(self).__name__}({str(self)!r})"


def bury(rt: Runtime, letter: DeadLetter, forgotten: bool = False) -> str:
    """Every dead letter goes through here: stored unless the prompt is already done,
    counted in the metrics, logged; in an until-verified run, its sample's chain moves on first
    (`chains.py`). `forgotten`: the ledger lost the prompt (see `Ledger.bury`)."""
    try:
        spec = cached_spec(rt.settings.redis_url, letter.run)
    except LookupError:  # a run whose spec cannot be read: its letter stays as made
        spec = None
    if spec is not None:
        _name_sample(spec, letter)
        letter.excerpt.update(_turn_of(spec, letter))
        _chain_on(rt, spec, letter)
    found = put_letter(rt.redis, letter, forgotten)
    if found == PromptState.DONE or found is None:
        log.warning("prompt %s is %s: its %s failure (%s) is not dead-lettered", letter.key,
                    "already stored" if found else "not in the ledger", letter.reason, letter.message)
        return f"not dead-lettered: prompt is {found or 'unknown'}"
    if found == PromptState.QUEUED:
        metrics.PROMPTS.labels(letter.run, "dead").inc()
    metrics.DEAD_LETTERS.labels(letter.reason).inc()
    log.info("prompt %s of run %s dead-lettered, %s: %s; details: python -m producer dead show %s --run %s",
             letter.key, letter.run, letter.reason, letter.message, letter.key, letter.run)
    return Buried(letter)


def put_letter(client: redis.Redis, letter: DeadLetter, forgotten: bool = False) -> str | None:
    """Store the letter (`DeadLetters.put`). Its message is acknowledged next, so where the
    primary has replicas it returns only once a replica has the letter, stored again on the new
    primary after a failover: a letter an old primary took in its last second would be lost with
    it, and its prompt left queued without a message until the audit found it."""
    letters = DeadLetters(client, letter.run)
    if not expected(client):  # a plain Redis without replicas: one call, as it was
        return letters.put(letter, forgotten)

    def once() -> str | None:
        with replicated(client):
            return letters.put(letter, forgotten)
    return written_again(once, f"the dead letter of prompt {letter.key} of run {letter.run}")


def _name_sample(spec: RunSpec, letter: DeadLetter) -> None:
    """A letter made for a sample's ledger key names its prompt's id and its sample (`key` gives
    the ledger key back); a key that is no sample's keeps itself as its id."""
    try:
        letter.of_sample(spec.samples)
    except ValueError:
        pass


def _chain_on(rt: Runtime, spec: RunSpec, letter: DeadLetter) -> None:
    """In an until-verified run, a dead-lettered sample queues the next of its chain (`chains.py`)."""
    if spec.until_verified is not None and letter.prompt_b64:
        chains.follow(rt, spec, letter.key, b64_to_ids(letter.prompt_b64))


def _turn_of(spec: RunSpec, letter: DeadLetter) -> dict:
    """A conversation turn's dead letter names its conversation and turn index."""
    try:
        return turn_columns(spec, letter.id)
    except ValueError:
        return {}


def _check_storage(rt: Runtime, prompt_id: str) -> None:
    """No generation whose sample could not be stored: the prompt goes back untouched."""
    storage = rt.shards.storage
    if not storage.up:
        raise GiveBack(f"prompt {prompt_id} not started: storage failing since "
                       f"{datetime.fromtimestamp(storage.since, timezone.utc):%H:%M:%S} UTC ({storage.last_error})")


def _store(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], tries: Attempts,
           generation: Generation, verdict: Verdict, submit: Submit, fields: dict | None = None) -> str:
    """Into a shard, which the writer marks done in the ledger with the rest of its group
    (`reconcile.ShardBook`); a sample no shard can hold is the prompt's bad_output. In a run with a
    verifier the answer is checked first, against the line's `fields`."""
    row = _row(rt, spec, prompt_id, prompt_ids, tries, generation, verdict)
    if spec.verify:  # the answer's check (a process of its own: never raises for what the check does)
        verified, label = verdict_of(rt.verdicts, spec, fields or {}, generation.output_ids)
        row = dataclasses.replace(row, verified=verified, verdict=label)
        metrics.VERDICTS.labels(verdict_class(verified, label)).inc()
    if spec.until_verified is not None and row.verified is not True:  # before it settles (chains.py)
        chains.follow(rt, spec, prompt_id, prompt_ids)
    try:
        return _commit(rt, spec.name, prompt_id, row, submit)
    except BadSample as exc:
        return bury(rt, _dead(rt, spec, prompt_id, prompt_ids, generation.sampling, tries,
                              Reason.BAD_OUTPUT, f"its sample cannot be stored: {exc}", generation))


def _commit(rt: Runtime, run: str, prompt_id: str, row: Sample, submit: Submit) -> str:
    """Wait for the shard that holds `row` (durable, and done in the ledger), at most
    FLEET_SHARD_COMMIT_TIMEOUT at a time; past that the sample is withdrawn and the prompt
    goes back to the queue, never to the dead letters. A sample whose write has begun gets
    one more deadline before the prompt goes back."""
    try:
        future = submit(run, row)
    except StorageUnavailable as exc:  # the worker is shutting down
        raise GiveBack(str(exc)) from exc
    _record_origins(rt, run)  # while the group commits: the sample is in it already
    timeout = rt.settings.shard_commit_timeout
    for _ in range(2):
        try:
            return _wait(future, timeout)
        except CommitTimeout:
            if rt.shards.withdraw(future):
                storage = rt.shards.storage
                log.warning("prompt %s: no shard took its sample within %.0fs (storage %s, last error: %s); "
                            "sample withdrawn, prompt given back", prompt_id, timeout,
                            "up" if storage.up else "failing", storage.last_error or "none")
                raise GiveBack(f"shard commit not done within {timeout:.0f}s") from None
    log.warning("prompt %s: its shard write has not finished after %.0fs; prompt given back (its "
                "sample may yet be stored and marked done: the ledger counts it once)", prompt_id, 2 * timeout)
    raise GiveBack(f"shard commit not done within {2 * timeout:.0f}s")


def _wait(future, timeout: float) -> str:
    try:
        return future.result(timeout)
    except StorageUnavailable as exc:  # the writer closed while storage was failing
        raise GiveBack(str(exc)) from exc


def _generation(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
                tries: Attempts, route: Route = NO_ROUTE) -> Generation:
    """Requests until a server answers. Raises `Unfit` when the prompt ends as a dead letter,
    `GiveBack` when no usable server is left.

    Every way round the loop spends a budget or shrinks the choice of servers:
    transient failures and bad answers `max_attempts`, connection failures
    `max_unavailable`, a refusal of our credentials refuses that server, and a
    cut follows its server's going down; no usable server gives the prompt back
    to the queue. `route` names the server the prompt's prefix is cached on, which it takes
    while the load guard allows (`workers/servers/affinity.py`).
    """
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
                    raise Unfit(_dead(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.PROMPT_TOO_LONG,
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
            raise Unfit(_dead(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.SERVER_REJECTED,
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


def _note_origin(rt: Runtime, spec: RunSpec, binding: ServerBinding, generation: Generation) -> None:
    """The run's provenance: this server, its SGLang version and model, and the weights that made the
    answer, noted once per (run, server, weight version) a worker sees (`contract/fleet/provenance.py`),
    and written once the sample has joined its shard's group (`_commit`) or is dead-lettered, never
    on its way there (a Redis that takes no writes would hold it back from its group)."""
    version = weight_version_of(generation.meta_info, binding.weight_version)
    rt.provenance.observe(spec.name, binding.url, version, binding.sglang_version, binding.model_path,
                          binding.served_model_name)


def _record_origins(rt: Runtime, run: str) -> None:
    """Write the origins noted so far; a failure is tried again after the next sample."""
    try:
        rt.provenance.flush(rt.redis)
    except redis.RedisError as exc:
        log.debug("run %s: provenance not recorded yet (%r)", run, exc)


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
    rt.pool.crashed(binding)
    when = datetime.fromtimestamp(at, timezone.utc)
    if server_crashes.convicted(tries.crashes):
        crashes = ", ".join(f"{c['server']} at {datetime.fromtimestamp(c['at'], timezone.utc):%H:%M:%S} UTC"
                            for c in tries.crashes)
        letter = _dead(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.SERVER_CRASH,
                       f"its server died each time it was in flight, the last {server_crashes.SOLO_DEATHS} times sent "
                       f"there alone ({crashes}); "
                       f"never sent again", excerpt={"crashes": tries.crashes})
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
    return _dead(rt, spec, prompt_id, prompt_ids, sampling, tries, reason, message,
                 excerpt=tries.last_bad_output)


def _dead(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
          tries: Attempts, reason: str, message: str,
          generation: Generation | None = None, excerpt: dict | None = None) -> DeadLetter:
    excerpt = dict(excerpt or {})
    if generation is not None:
        out = generation.output_ids
        excerpt = {
            "output_len": len(out),
            "last_output_ids": out[-64:],
            "first_output_ids": out[:16],
            "finish_reason": generation.meta_info.get("finish_reason"),
            "completion_tokens": generation.meta_info.get("completion_tokens"),
            "prompt_tokens_seen": generation.meta_info.get("prompt_tokens"),
            "server": generation.server,
            **think_positions(out, spec),
        }
    return DeadLetter(
        id=prompt_id, run=spec.name, reason=reason, message=message, attempts=tries.total,
        servers=sorted(set(tries.servers)), worker=rt.worker, prompt_b64=ids_to_b64(prompt_ids),
        prompt_tokens=len(prompt_ids), sampling=sampling, excerpt=excerpt,
        first_attempt_at=tries.started_at,
    ).of_sample(spec.samples)


def _row(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], tries: Attempts,
         generation: Generation, verdict: Verdict) -> Sample:
    out, meta, sampling = generation.output_ids, generation.meta_info, generation.sampling
    finish = meta.get("finish_reason") or {}
    matched = finish.get("matched") if isinstance(finish, dict) else None
    binding_model = next((b.model_path for b in rt.pool.bindings if b.url == generation.server), None)
    line_id, index = split_sample_key(prompt_id, spec.samples)
    return Sample(
        id=line_id,
        input_ids=prompt_ids + out,
        prompt_len=len(prompt_ids),
        output_len=len(out),
        finish_reason=finish.get("type") if isinstance(finish, dict) else str(finish),
        stop_token=matched if isinstance(matched, int) else None,
        think_end_index=None if verdict.think_end_pos is None else len(prompt_ids) + verdict.think_end_pos,
        run=spec.name,
        server=generation.server,
        model=binding_model,
        max_new_tokens=sampling.get("max_new_tokens"),
        temperature=sampling.get("temperature"),
        top_p=sampling.get("top_p"),
        attempts=tries.total,
        worker=rt.worker,
        tokenizer_fingerprint=spec.tokenizer_fingerprint,
        template_fingerprint=spec.template_fingerprint,
        e2e_latency=meta.get("e2e_latency"),
        started_at=datetime.fromtimestamp(tries.started_at, timezone.utc),
        finished_at=datetime.now(timezone.utc),
        **turn_columns(spec, prompt_id),
        cached_tokens=generation.cached_tokens,
        top_k=sampling.get("top_k"),
        min_p=sampling.get("min_p"),
        **_logprob_columns(generation),
        weight_version=weight_version_of(meta, next((b.weight_version for b in rt.pool.bindings
                                                     if b.url == generation.server), None)),
        sample=index,
        seed=sampling.get("sampling_seed"),
    )


def _logprob_columns(generation: Generation) -> dict:
    """The `--logprobs K` columns (contract/run/logprobs.py); none where not asked."""
    scores = generation.logprobs
    if scores is None:
        return {}
    return {"logprobs": scores.chosen, "top_logprob_ids": scores.top_ids, "top_logprobs": scores.top}
