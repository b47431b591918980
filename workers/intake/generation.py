"""One prompt, from token ids to a durable sample or a dead letter.

The requests themselves are `request_loop.py`'s (until a server answers), what
happened along the way `attempts.py`'s, and a prompt that ends as a dead letter
goes through `burial.py`; here the answer is verified, and stored.

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
from concurrent.futures import Future, TimeoutError as CommitTimeout
from datetime import datetime, timezone
from typing import Callable

from contract.chat.conversations import split_turn_id
from contract.fleet.provenance import weight_version_of
from contract.names import Reason
from contract.run.line_fields import LineFields
from contract.run.line_sampling import line_seed, merged
from contract.run.samples import resample_seed, sample_seed, split_sample_key
from contract.run.spec import RunSpec
from contract.run.verifiers import verdict_class
from contract.storage.schema import Sample

from ..output.shards import BadSample, StorageUnavailable
from ..output.turns import turn_columns
from ..output.verdicts import verdict_of
from ..output.verify import Verdict, verify
from ..reporting import metrics
from ..servers.affinity import Route
from ..servers.sglang_client import Generation
from . import chains, server_crashes
from .attempts import Attempts, GiveBack, Unfit
from .burial import bury, dead_letter
from .request_loop import answer, record_origins
from .runtime import Runtime

log = logging.getLogger(__name__)


Submit = Callable[[str, Sample], Future]  # hands a run's sample to the shard writer


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
        return bury(rt, dead_letter(rt, spec, prompt_id, prompt_ids, sampling, tries, Reason.WORKER_ERROR,
                                    f"prompt id {max(prompt_ids)} is not a token id of the run's tokenizer "
                                    f"({spec.vocab_size} ids); not sent"))
    route = rt.affinity.route(rt.redis, spec.name, spec.turns == "all", prompt_id, prompt_ids)
    try:
        return _generate_and_settle(rt, spec, prompt_id, prompt_ids, sampling, tries, route, submit, fields)
    finally:
        record_origins(rt, spec.name)  # the servers' versions its answers came with (a dead letter's too)


def _generate_and_settle(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
                         tries: Attempts, route: Route, submit: Submit, fields: dict) -> str:
    """Requests until an answer passes the think checks (stored) or the prompt ends as a dead letter."""
    try:
        while True:
            generation = answer(rt, spec, prompt_id, prompt_ids, sampling, tries, route)
            verdict = verify(generation.output_ids, generation.meta_info, len(prompt_ids), spec)
            if verdict.ok:
                return _store(rt, spec, prompt_id, prompt_ids, tries, generation, verdict, submit, fields)
            if rt.settings.resample_on_verify_failure and not tries.resampled:
                tries.resampled = True
                sampling = _resampling(sampling)
                continue
            metrics.VERIFY_FAILURES.labels(verdict.reason).inc()
            raise Unfit(dead_letter(rt, spec, prompt_id, prompt_ids, generation.sampling, tries,
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
        return bury(rt, dead_letter(rt, spec, prompt_id, prompt_ids, generation.sampling, tries,
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
    record_origins(rt, run)  # while the group commits: the sample is in it already
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

