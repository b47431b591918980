"""Publishing prompts as tasks, shared by the producer, dead-letter replay and the audit."""
from __future__ import annotations

from .payload import task_argsrepr

TASK = "fleet.generate"


def publish_prompts(app, run: str, queue: str, prompts: list[tuple[str, int, int | None]]) -> None:
    """Publish (id, prompt tokens, max_new_tokens override) tuples in one pipelined batch.

    The message carries only the run and prompt id (the token ids are in the
    ledger) and a short `argsrepr`, so publishing costs little and Flower shows
    the prompt, not its ids.
    """
    with app.producer_or_acquire() as producer, producer.batch(max(len(prompts), 1)):
        target = app.amqp.queues[queue]
        producer.maybe_declare(target)  # once per batch, not once per message
        for prompt_id, n_tokens, max_new_tokens in prompts:
            args = (run, prompt_id) + ((max_new_tokens,) if max_new_tokens else ())
            app.send_task(
                TASK, args, task_id=f"{run}:{prompt_id}", queue=target, producer=producer, declare=[],
                argsrepr=task_argsrepr(run, prompt_id, n_tokens), kwargsrepr="",
            )
