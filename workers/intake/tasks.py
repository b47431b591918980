"""The one task: generate a prompt's trace and store it (or dead-letter it).

The message names the run and the prompt; the token ids are in the run's
ledger. With late acknowledgement a task that raises would be acknowledged
and its prompt lost, so nothing escapes here: no free server gives the prompt
back to the queue, and an unexpected error (a broker blip while marking it
done, a bug) requeues it, until the same prompt has failed this way
`max_crashes` times and becomes a `worker_error` dead letter.

Before generating, the task records the delivery (`deliveries`; in the common
case in the same call that reads the prompt's ids, `Ledger.intake`): a prompt
whose deliveries keep killing their workers ends as a `poison` dead letter
instead of killing the next one (its last allowed delivery runs alone among
such prompts in its worker, so bystanders of its deaths are not blamed). A
second message of a prompt that a live worker is generating (a Redis crash
between kombu's take and its record; `deliveries.elsewhere`) is acknowledged
without generating. A message whose prompt the ledger has never
heard of (neither ids nor state: Redis evicted or lost them) is never
acknowledged silently: it becomes a `worker_error` dead letter that says so.

A prompt whose sample an earlier delivery was writing to a shard (its worker
died between the link and the ledger's `done`) is found there and marked done
instead of generated again (`reconcile.py`); this comes before the poison
count, since that delivery's death is counted against it.

A SIGTERM hand-back (`shutdown`) must not hand back a sample that is already
being committed, so the task counts the samples it gave the shard writer until
it returns (`committing()`): the hand-back waits for them to be marked done
(the shard writer marks a group done before it releases the group's tasks).
"""
from __future__ import annotations

import logging
import threading
import traceback
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Iterator

from celery import shared_task
from celery.exceptions import Reject

from contract.ledger.codec import ids_to_b64, unpack_ids
from contract.ledger.deadletters import DeadLetter
from contract.keys import TASK_NAME, RunKeys
from contract.ledger.ledger import Ledger
from contract.names import PromptState, Reason
from contract.storage.schema import Sample

from . import confirmed_intake, deliveries
from ..output import turns
from .deliveries import STARTED
from .attempts import GiveBack, SettledElsewhere
from .burial import Buried, DeadLettered, bury
from .generation import process_prompt
from .group_acks import GROUP_ACKS
from .lease import hold_limit
from .recent import ADVANCED
from .reconcile import reconciled
from .runtime import Runtime, get_runtime
from ..output.shards import ShardWriter
from .specs import cached_spec, refusal

log = logging.getLogger(__name__)
# Set when the SIGTERM grace is over: a task failing then is being cut short, not crashing.
HANDING_BACK = threading.Event()
_LAST_CHANCE = threading.Lock()  # one prompt on its last allowed delivery at a time in a worker


@shared_task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True, throws=(DeadLettered,))
def generate(self, run: str, prompt_id: str, max_new_tokens: int | None = None) -> str:
    """A dead-lettered prompt ends as a failed task whose exception names its reason, so Flower
    counts it as failed (`throws`: an expected failure, which Celery logs at INFO without a
    traceback, hidden unless FLEET_TASK_LOG; `bury` logged its one line; acknowledged like any
    finished task, never retried)."""
    outcome = _generate(self, run, prompt_id, max_new_tokens)
    if isinstance(outcome, Buried):
        raise DeadLettered(outcome.reason, outcome.message)
    return outcome


def _generate(self, run: str, prompt_id: str, max_new_tokens: int | None) -> str:
    rt = get_runtime(self.app.fleet_settings)
    ledger = Ledger(rt.redis, run)
    raw = None
    try:
        if (refused := refusal(rt.settings.redis_url, run)) is not None:
            return refused  # acknowledged, not generated: this version does not read the run's ledger
        if STARTED.holds(run, prompt_id):  # a second message of a prompt this process generates
            return f"nothing to do: prompt is generating on {rt.worker}"
        with STARTED.taking(run, prompt_id):  # listed as held from before its note
            intake = confirmed_intake.take(rt.redis, run, prompt_id, rt.worker, rt.settings.max_deliveries)
            if intake.noted and (other := deliveries.elsewhere(
                    rt.redis, run, prompt_id, rt.worker, intake.held_by, rt.settings.heartbeat_ttl)):
                deliveries.undo(rt.redis, run, prompt_id, rt.worker)  # not a delivery: a duplicate message
                log.info("prompt %s of run %s: a second message, acknowledged (%s generates it)", prompt_id, run,
                         other)
                return f"nothing to do: prompt is generating on {other}"
            if intake.noted and (settled := deliveries.settled_meanwhile(
                    rt.redis, run, prompt_id, rt.worker, intake.held_by)):
                deliveries.undo(rt.redis, run, prompt_id, rt.worker)  # not a delivery: a late duplicate
                log.info("prompt %s of run %s: a second message, acknowledged (%s by another worker meanwhile)",
                         prompt_id, run, settled)
                return f"nothing to do: prompt is {settled}"
            if intake.noted:  # the common case: ids read and this delivery noted, one round trip
                STARTED.counted(run, prompt_id)
        raw, writing = intake.ids, intake.writing
        max_new_tokens = intake.budget or max_new_tokens  # a requeue's, whichever message brought the prompt
        if raw is None:
            return _without_ids(self.app, rt, ledger, run, prompt_id, max_new_tokens)
        if writing is not None and (found := _reconciled(rt, ledger, prompt_id, writing)):
            spec = cached_spec(rt.settings.redis_url, run)
            if spec.turns == "all":  # stored by a worker that died before moving its conversation on
                _next_turn(self.app, rt, spec, prompt_id)
            return found
        before = intake.held_by if writing is None else deliveries.holders(rt.redis, run, prompt_id)
        if len(before) > rt.settings.max_deliveries:
            return _bury_poison(rt, run, prompt_id, raw, max_new_tokens, before)
        with _alone_if(len(before) == rt.settings.max_deliveries, rt, run, prompt_id):
            if not intake.noted:  # its last chance (noted once alone here), or a write to reconcile
                STARTED.start(rt.redis, run, prompt_id, rt.worker)
            spec = cached_spec(rt.settings.redis_url, run)
            if spec.turns == "all":  # its next turn is rendered here: the tokenizer loads meanwhile
                turns.warm(spec)
            tag = None if spec.turns == "all" else (self.request.properties or {}).get("delivery_tag")
            with TaskSamples(rt.shards, tag, prompt_id) as samples:
                outcome = process_prompt(rt, spec, prompt_id, unpack_ids(raw), max_new_tokens, samples.submit)
        STARTED.finish(rt.redis, run, prompt_id, cleared=samples.marked_done())
        if spec.turns == "all" and not isinstance(outcome, Buried):
            _next_turn(self.app, rt, spec, prompt_id, samples.last_row, outcome)
        return outcome
    except GiveBack as exc:
        STARTED.take_back(rt.redis, run, prompt_id, rt.worker)
        raise Reject(str(exc), requeue=True) from exc
    except SettledElsewhere as exc:  # not a delivery that ended here: another worker's, settled
        STARTED.take_back(rt.redis, run, prompt_id, rt.worker)
        log.info("prompt %s of run %s: %s by another worker while this one waited for its earlier "
                 "request on the server; not sent again", prompt_id, run, exc)
        return f"nothing to do: prompt is {exc}"
    except Exception as exc:
        if rt.writes.failed(exc):  # Redis takes no writes now: neither the prompt's fault nor a crash
            _take_back_if_possible(rt, run, prompt_id)
            raise Reject(f"Redis refuses writes: {exc}", requeue=True) from exc
        # Its worker did not die: not a delivery to count (a crash is counted as a crash).
        STARTED.take_back(rt.redis, run, prompt_id, rt.worker)
        if HANDING_BACK.is_set():
            raise Reject(f"cut short by shutdown: {exc!r}", requeue=True) from exc
        log.exception("prompt %s of run %s failed unexpectedly", prompt_id, run)
        crashes = rt.redis.hincrby(RunKeys(run).crashes, prompt_id, 1)
        if crashes < rt.settings.max_crashes or raw is None or ledger.state(prompt_id) == PromptState.DONE:
            raise Reject(f"requeued after {exc!r}", requeue=True) from exc
        deliveries.clear(rt.redis, run, prompt_id)
        return _bury_worker_error(rt, run, prompt_id, raw, max_new_tokens, crashes,
                                  f"{crashes} crashes; last: {exc!r}", traceback.format_exc()[-4000:])


def _take_back_if_possible(rt: Runtime, run: str, prompt_id: str) -> None:
    """Undo this delivery's note, where Redis lets us (a refused undo leaves one delivery counted)."""
    try:
        STARTED.take_back(rt.redis, run, prompt_id, rt.worker)
    except Exception as exc:  # the same refusal, most likely
        log.warning("prompt %s: its delivery stays noted (%r)", prompt_id, exc)


@contextmanager
def _alone_if(last_chance: bool, rt: Runtime, run: str, prompt_id: str) -> Iterator[None]:
    """A prompt on its last allowed delivery runs as the only such prompt in this worker, so
    that if the worker dies again, the death is its own and not a bystander's: prompts that were
    merely in flight beside a poison one wait here (uncounted, but listed as held in the
    heartbeat, which the audit reads before republishing such a prompt) and finish."""
    if not last_chance:
        yield
        return
    with STARTED.taking(run, prompt_id):
        acquired = _LAST_CHANCE.acquire(timeout=hold_limit(rt.settings))
    if not acquired:
        raise GiveBack("another prompt on its last delivery held this worker too long")
    try:
        yield
    finally:
        _LAST_CHANCE.release()


def _reconciled(rt: Runtime, ledger: Ledger, prompt_id: str, shard: str) -> str | None:
    """The prompt's sample was being written to `shard` when an earlier delivery ended: if it
    is there, the prompt is done without generating (`reconcile.py`), its deliveries forgotten."""
    try:
        samples = cached_spec(rt.settings.redis_url, ledger.run).samples
        found = reconciled(ledger, rt.settings.output_dir, prompt_id, shard, samples)
    except OSError as exc:  # storage cannot tell yet: keep the entry, try again later
        raise GiveBack(f"cannot read shard {shard} to see whether it holds prompt {prompt_id}: {exc}") from exc
    if found:
        deliveries.clear(rt.redis, ledger.run, prompt_id)
    return found


def _next_turn(app, rt: Runtime, spec, prompt_id: str, row=None, path: str | None = None) -> None:
    """A conversation's turn is stored: queue its next turn (`turns.advance`). A failure here
    never fails the task, whose turn is stored: the conversation waits at this turn for the
    audit's sweep (`turns.stalled`, `turns.resume`), which tries again."""
    stored = (path, row.input_ids, row.prompt_len, row.server) if row is not None and row.id == prompt_id and path \
        else None
    try:
        outcome = turns.advance(app, rt, spec, prompt_id, stored)
        ADVANCED.add((spec.name, prompt_id))  # a failover may lose it: asserted again (`failover.py`)
        log.debug("turn %s stored; its conversation: %s", prompt_id, outcome)
    except Exception as exc:
        log.error("turn %s is stored, but its conversation could not move on (the audit tries again): %r",
                  prompt_id, exc)


def _without_ids(app, rt: Runtime, ledger: Ledger, run: str, prompt_id: str, max_new_tokens: int | None) -> str:
    """A message whose prompt has no ids in the ledger: finished already, or forgotten."""
    state = ledger.state(prompt_id)
    if state == PromptState.DONE and (spec := cached_spec(rt.settings.redis_url, run)).turns == "all":
        _next_turn(app, rt, spec, prompt_id)  # its worker may have died before moving its conversation on
    if state in (PromptState.DONE, PromptState.DEAD):  # a redelivery of a finished prompt
        return f"nothing to do: prompt is {state}"
    if state is None:
        return _bury_worker_error(rt, run, prompt_id, None, max_new_tokens, 0, (
            "Redis has forgotten this prompt: its message was queued, but the run's ledger holds "
            "neither its token ids nor its state (evicted or flushed? Redis needs "
            "maxmemory-policy noeviction and persistence); enqueue its line again"), forgotten=True)
    return _bury_worker_error(rt, run, prompt_id, None, max_new_tokens, 0, "queued, but the ledger "
                              "holds no token ids for it (enqueued by another version of the fleet?)")


def _bury_poison(rt: Runtime, run: str, prompt_id: str, raw: bytes, max_new_tokens: int | None,
                 held_by: list[str]) -> str:
    """A prompt whose deliveries never finished, the last one alone in its worker: each of its
    workers died holding it."""
    ids = _readable_ids(raw) or []
    deliveries.clear(rt.redis, run, prompt_id)
    return bury(rt, DeadLetter(
        id=prompt_id, run=run, reason=Reason.POISON, attempts=len(held_by), servers=[],
        message=(f"delivered {len(held_by)} times without finishing, the last time alone in its worker "
                 f"(FLEET_MAX_DELIVERIES={rt.settings.max_deliveries}); the workers that held it, which "
                 f"died or lost it: {', '.join(held_by)}"),
        worker=rt.worker, prompt_b64=ids_to_b64(ids), prompt_tokens=len(ids),
        sampling={"max_new_tokens": max_new_tokens}, excerpt={"held_by": held_by}))


def _bury_worker_error(rt, run: str, prompt_id: str, raw: bytes | None, max_new_tokens: int | None,
                       attempts: int, message: str, trace: str = "", forgotten: bool = False) -> str:
    """A `worker_error` dead letter: the prompt ends somewhere, with what is known of it."""
    ids = _readable_ids(raw)
    if raw is not None and ids is None:
        message += "; its ledger entry is unreadable"
    return bury(rt, DeadLetter(
        id=prompt_id, run=run, reason=Reason.WORKER_ERROR, message=message, attempts=attempts, servers=[],
        worker=rt.worker, prompt_b64=ids_to_b64(ids or []), prompt_tokens=len(ids or []),
        sampling={"max_new_tokens": max_new_tokens}, excerpt={"traceback": trace} if trace else {}),
        forgotten)


def _readable_ids(raw: bytes | None) -> list[int] | None:
    """The prompt's ids for its dead letter; None when there are none or the ledger entry itself
    is what failed (the letter must still be written, or the prompt would be requeued forever)."""
    if raw is None:
        return None
    try:
        return unpack_ids(raw)
    except (ValueError, IndexError):
        return None


def committing() -> int:
    """Samples handed to the shard writer by tasks that have not returned yet."""
    return TaskSamples.in_flight


class TaskSamples:
    """What one task hands the shard writer: its samples are counted in `committing()` from
    their submit until the task leaves the `with` block (marked done, or failed). With `tag`
    (its message's delivery tag), the group commit that marks a sample done also acknowledges
    the message, until the task leaves the block (`group_acks`). `key` is the prompt's ledger
    key (a sample's `<id>~<index>` in a run of several samples a prompt, whose rows keep the
    prompt's id in `id`)."""

    in_flight = 0  # across the worker's tasks
    _lock = threading.Lock()

    def __init__(self, writer: ShardWriter, tag: str | None = None, key: str | None = None):
        self.writer, self.tag, self.key = writer, tag, key
        self.last_row: Sample | None = None  # a conversation's next turn is rendered from it
        self._futures: list[Future] = []
        self._expected: list[tuple[str, str]] = []

    def __enter__(self) -> "TaskSamples":
        return self

    def __exit__(self, *_) -> None:
        self._count(-len(self._futures))
        for run, prompt_id in self._expected:
            GROUP_ACKS.drop(run, prompt_id, self.tag)

    def submit(self, run: str, row: Sample) -> Future:
        if self.tag:
            key = self.key or row.id
            GROUP_ACKS.expect(run, key, self.tag)
            self._expected.append((run, key))
        future = self.writer.submit(run, row)
        self._futures.append(future)
        self.last_row = row
        self._count(1)
        return future

    def marked_done(self) -> bool:
        """Whether a sample of this task is in a shard and marked done (its group commit also
        forgot the prompt's deliveries)."""
        return any(f.done() and not f.cancelled() and f.exception() is None for f in self._futures)

    @classmethod
    def _count(cls, n: int) -> None:
        with cls._lock:
            cls.in_flight += n
