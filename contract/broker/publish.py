"""Publishing prompts as tasks, shared by the producer, dead-letter replay and the audit.

A run publishes millions of prompts, so the per-message cost matters as much
as the tokenizer's. `app.send_task` pays, per message, for routing, signals,
a queue declaration and a separate `task-sent` event publish; here each batch
declares its queue once, builds protocol-2 messages with Celery's own
`as_task_v2`, pushes them through one pipelined kombu producer, and sends the
batch's `task-sent` events as one buffered event message (Celery's event
receivers, Flower's included, unpack such lists).

The samples of a prompt (`enqueue --samples N`, `contract/run/samples.py`) are
recorded and published here too, by the producer and by a worker that queues
the next sample of an until-verified chain: each sample's key its own ledger
entry (a copy of the ids) and message, interleaved in groups of `SPREAD`
prompts so a prompt's next sample is not prefilled in the same step as the one
before it (the prefix cache holds the prompt by then).
"""
from __future__ import annotations

from typing import Iterable

from contract.ledger.codec import pack_ids, task_argsrepr
from contract.keys import TASK_NAME, task_id
from contract.ledger.ledger import NEW, Ledger
from contract.run.samples import sample_key, split_sample_key

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


SPREAD = 8  # prompts whose samples are published interleaved (module docstring)


def spread(messages: list[tuple[str, int, None]], samples: int) -> list[tuple[str, int, None]]:
    """The messages of samples' keys in publishing order: in groups of `SPREAD` prompts (in the
    order they came), the first sample given of each prompt, then the next of each, and so on."""
    by_prompt: dict[str, list] = {}
    for message in messages:
        by_prompt.setdefault(split_sample_key(message[0], samples)[0], []).append(message)
    prompts, ordered = list(by_prompt.values()), []
    for start in range(0, len(prompts), SPREAD):
        group = prompts[start:start + SPREAD]
        for rank in range(max(len(p) for p in group)):
            ordered += [p[rank] for p in group if rank < len(p)]
    return ordered


def enqueue_samples(ledger: Ledger, samples: int, call: str,
                    prompts: list[tuple[str, list[int], Iterable[int]]]) -> list[list[str]]:
    """Record the given samples of each (prompt id, token ids, sample indices) in the ledger: each
    index's key its own entry (a copy of the ids) where the ledger did not have it; per prompt, the
    outcome of each index in order, as `Ledger.enqueue` says. Sample 0 of a prompt counts the
    prompt in the run's `prompts` in the same step."""
    records, firsts, shape = [], [], []
    for prompt_id, ids, indices in prompts:
        packed, indices = pack_ids(ids), list(indices)
        for index in indices:
            records.append((sample_key(prompt_id, index, samples), packed))
            firsts.append(index == 0)
        shape.append(len(indices))
    outcomes = ledger.enqueue(records, call, firsts=firsts)
    found, start = [], 0
    for n in shape:
        found.append(outcomes[start:start + n])
        start += n
    return found


def publish_samples(app, ledger: Ledger, samples: int, queue: str, call: str,
                    prompts: list[tuple[str, list[int], Iterable[int]]]) -> list[str]:
    """Record (`enqueue_samples`), then publish, the given samples of each prompt; the keys
    published (those the ledger did not have). A crash in between leaves queued samples without a
    message, which the workers' audit republishes."""
    prompts = [(pid, ids, list(indices)) for pid, ids, indices in prompts]
    new = new_messages(samples, prompts, enqueue_samples(ledger, samples, call, prompts))
    publish_prompts(app, ledger.run, queue, new)
    return [key for key, _, _ in new]


def new_messages(samples: int, prompts: list[tuple[str, list[int], list[int]]],
                 outcomes: list[list[str]]) -> list[tuple[str, int, None]]:
    """The messages of the samples the ledger took as new (`outcomes`, per prompt, of each of its
    (prompt id, token ids, sample indices)), in publishing order (`spread`)."""
    new = [(sample_key(pid, index, samples), len(ids), None) for (pid, ids, indices), found in zip(prompts, outcomes)
           for index, outcome in zip(indices, found) if outcome == NEW]
    return spread(new, samples) if samples > 1 else new
