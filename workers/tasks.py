"""The one task: generate a prompt's trace and store it (or dead-letter it).

The message names the run and the prompt; the token ids are in the run's
ledger. With late acknowledgement a task that raises would be acknowledged
and its prompt lost, so nothing escapes here: no free server gives the prompt
back to the queue, and an unexpected error (a broker blip while marking it
done, a bug) requeues it, until the same prompt has failed this way
`max_crashes` times and becomes a `worker_error` dead letter.
"""
from __future__ import annotations

import logging
import traceback

from celery import shared_task
from celery.exceptions import Reject

from contract.codec import ids_to_b64, unpack_ids
from contract.deadletters import DeadLetter
from contract.keys import TASK_NAME, RunKeys
from contract.ledger import Ledger
from contract.names import PromptState, Reason

from .generation import GiveBack, bury, process_prompt
from .runtime import get_runtime
from .specs import cached_spec

log = logging.getLogger(__name__)


@shared_task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)
def generate(self, run: str, prompt_id: str, max_new_tokens: int | None = None) -> str:
    rt = get_runtime(self.app.fleet_settings)
    ledger = Ledger(rt.redis, run)
    raw = None
    try:
        raw = ledger.payload(prompt_id)
        if raw is None:
            state = ledger.state(prompt_id)
            if state != PromptState.QUEUED:  # a redelivery of a prompt already stored or dead-lettered
                return f"nothing to do: prompt is {state or 'unknown'}"
            return _bury_worker_error(rt, run, prompt_id, None, max_new_tokens, 0, "queued, but the ledger "
                                      "holds no token ids for it (enqueued by another version of the fleet?)")
        spec = cached_spec(rt.settings.redis_url, run)
        return process_prompt(rt, spec, prompt_id, unpack_ids(raw), max_new_tokens)
    except GiveBack as exc:
        raise Reject(str(exc), requeue=True) from exc
    except Exception as exc:
        log.exception("prompt %s of run %s failed unexpectedly", prompt_id, run)
        crashes = rt.redis.hincrby(RunKeys(run).crashes, prompt_id, 1)
        if crashes < rt.settings.max_crashes or raw is None or ledger.state(prompt_id) == PromptState.DONE:
            raise Reject(f"requeued after {exc!r}", requeue=True) from exc
        return _bury_worker_error(rt, run, prompt_id, raw, max_new_tokens, crashes,
                                  f"{crashes} crashes; last: {exc!r}", traceback.format_exc()[-4000:])


def _bury_worker_error(rt, run: str, prompt_id: str, raw: bytes | None, max_new_tokens: int | None,
                       attempts: int, message: str, trace: str = "") -> str:
    """A `worker_error` dead letter: the prompt ends somewhere, with what is known of it."""
    ids = _readable_ids(raw)
    if raw is not None and ids is None:
        message += "; its ledger entry is unreadable"
    return bury(rt, DeadLetter(
        id=prompt_id, run=run, reason=Reason.WORKER_ERROR, message=message, attempts=attempts, servers=[],
        worker=rt.worker, prompt_b64=ids_to_b64(ids or []), prompt_tokens=len(ids or []),
        sampling={"max_new_tokens": max_new_tokens}, excerpt={"traceback": trace} if trace else {}))


def _readable_ids(raw: bytes | None) -> list[int] | None:
    """The prompt's ids for its dead letter; None when there are none or the ledger entry itself
    is what failed (the letter must still be written, or the prompt would be requeued forever)."""
    if raw is None:
        return None
    try:
        return unpack_ids(raw)
    except (ValueError, IndexError):
        return None
