"""The one task: generate a prompt's trace and store it (or dead-letter it)."""
from __future__ import annotations

from celery import shared_task
from celery.exceptions import Reject

from .generation import GiveBack, process_prompt
from .payload import unpack_ids
from .runs import cached_spec
from .runtime import get_runtime


@shared_task(name="fleet.generate", bind=True, acks_late=True, ignore_result=True)
def generate(self, run: str, prompt_id: str, prompt_b64: str, max_new_tokens: int | None = None) -> str:
    rt = get_runtime()
    spec = cached_spec(rt.settings.redis_url, run)
    try:
        return process_prompt(rt, spec, prompt_id, unpack_ids(prompt_b64), max_new_tokens)
    except GiveBack as exc:
        raise Reject(str(exc), requeue=True) from exc
