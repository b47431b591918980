"""The one task: generate a prompt's trace and store it (or dead-letter it).

With late acknowledgement a task that raises would be acknowledged and its
prompt lost, so nothing escapes here: no free server gives the prompt back to
the queue, and an unexpected error (a broker blip while marking it done, a
bug) requeues it, until the same prompt has failed this way `max_crashes`
times and becomes a `worker_error` dead letter with the traceback.
"""
from __future__ import annotations

import logging
import traceback

from celery import shared_task
from celery.exceptions import Reject

from .deadletter import WORKER_ERROR, DeadLetter, DeadLetters
from .generation import GiveBack, process_prompt
from .payload import unpack_ids
from .runs import RunKeys, cached_spec
from .runtime import get_runtime

log = logging.getLogger(__name__)


@shared_task(name="fleet.generate", bind=True, acks_late=True, ignore_result=True)
def generate(self, run: str, prompt_id: str, prompt_b64: str, max_new_tokens: int | None = None) -> str:
    rt = get_runtime()
    try:
        spec = cached_spec(rt.settings.redis_url, run)
        return process_prompt(rt, spec, prompt_id, unpack_ids(prompt_b64), max_new_tokens)
    except GiveBack as exc:
        raise Reject(str(exc), requeue=True) from exc
    except Exception as exc:
        log.exception("prompt %s of run %s failed unexpectedly", prompt_id, run)
        crashes = rt.redis.hincrby(RunKeys(run).crashes, prompt_id, 1)
        if crashes < rt.settings.max_crashes:
            raise Reject(f"requeued after {exc!r}", requeue=True) from exc
        DeadLetters(rt.redis, run).put(DeadLetter(
            id=prompt_id, run=run, reason=WORKER_ERROR, message=f"{crashes} crashes; last: {exc!r}",
            attempts=crashes, servers=[], worker=rt.worker, prompt_b64=prompt_b64,
            prompt_tokens=len(unpack_ids(prompt_b64)), sampling={"max_new_tokens": max_new_tokens},
            excerpt={"traceback": traceback.format_exc()[-4000:]}))
        return f"dead: {WORKER_ERROR}"
