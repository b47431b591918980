"""Publishing prompts as tasks, shared by the producer, dead-letter replay and the audit.

A run publishes millions of prompts, so the per-message cost matters as much
as the tokenizer's. `app.send_task` pays, per message, for routing, signals,
a queue declaration and a separate `task-sent` event publish; here each batch
declares its queue once, builds protocol-2 messages with Celery's own
`as_task_v2`, pushes them through one pipelined kombu producer, and sends the
batch's `task-sent` events as one buffered event message (Celery's event
receivers, Flower's included, unpack such lists).
"""
from __future__ import annotations

from .codec import task_argsrepr
from .keys import TASK_NAME, task_id

CHUNK = 500  # messages a pipeline carries, and task-sent events one event message carries


def publish_prompts(app, run: str, queue: str, prompts: list[tuple[str, int, int | None]]) -> None:
    """Publish (id, prompt tokens, max_new_tokens override) tuples, in pipelined chunks.

    The message carries only the run and prompt id (the token ids are in the
    ledger) and a short `argsrepr`, so publishing costs little and Flower shows
    the prompt, not its ids.
    """
    for start in range(0, len(prompts), CHUNK):
        _publish_chunk(app, run, queue, prompts[start:start + CHUNK])


def _publish_chunk(app, run: str, queue: str, prompts: list[tuple[str, int, int | None]]) -> None:
    from celery.utils.nodenames import anon_nodename

    origin, target = anon_nodename(), app.amqp.queues[queue]
    with app.producer_or_acquire() as producer, producer.batch(len(prompts)), \
            _sent_events(app, producer, len(prompts)) as events:
        producer.maybe_declare(target)
        for prompt_id, n_tokens, max_new_tokens in prompts:
            tid = task_id(run, prompt_id)
            args = (run, prompt_id) + ((max_new_tokens,) if max_new_tokens else ())
            argsrepr = task_argsrepr(run, prompt_id, n_tokens)
            headers, properties, body, _ = app.amqp.as_task_v2(
                tid, TASK_NAME, args, argsrepr=argsrepr, kwargsrepr="", origin=origin,
                ignore_result=None)  # as send_task: the task's own setting decides
            producer.publish(body, exchange="", routing_key=queue, headers=headers, declare=[],
                             serializer="json", delivery_mode=2, **properties)
            events.send("task-sent", uuid=tid, root_id=tid, parent_id=None, name=TASK_NAME,
                        args=argsrepr, kwargs="", retries=0, eta=None, expires=None,
                        queue=queue, exchange="", routing_key=queue)
        events.flush()


def _sent_events(app, producer, count: int):
    """A dispatcher that holds this batch's `task-sent` events and publishes them as one
    message (a no-op when `task_send_sent_event` is off)."""
    return app.events.Dispatcher(producer.connection, enabled=app.conf.task_send_sent_event,
                                 buffer_group=["task"], buffer_limit=count + 1)
