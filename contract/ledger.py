"""Where each prompt of a run stands, and the token ids of those still to do.

The producer writes a prompt's token ids and marks it queued before it
publishes the message (so a crash in between leaves a prompt the audit can
republish, never one that is lost); workers read the ids from here, and mark a
prompt done once its sample is durable in a shard (which also drops its ids
and clears an earlier dead letter). A re-run of `enqueue` skips every prompt
the ledger already has.
"""
from __future__ import annotations

import time

import redis

from .keys import RunKeys
from .names import PromptState

QUEUED, DONE, DEAD = PromptState.QUEUED, PromptState.DONE, PromptState.DEAD


class Ledger:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.keys = client, RunKeys(run)

    def state(self, prompt_id: str) -> str | None:
        raw = self.client.hget(self.keys.state, prompt_id)
        return raw.decode() if raw else None

    def states(self, prompt_ids: list[str]) -> list[str | None]:
        if not prompt_ids:
            return []
        return [r.decode() if r else None for r in self.client.hmget(self.keys.state, prompt_ids)]

    def payload(self, prompt_id: str) -> bytes | None:
        return self.client.hget(self.keys.prompts, prompt_id)

    def pending_ids(self) -> set[str]:
        """Prompts whose ids are still held: queued, in flight, or lost in transit."""
        return {k.decode() for k in self.client.hkeys(self.keys.prompts)}

    def mark_queued(self, pipe: redis.client.Pipeline, payloads: dict[str, bytes], tokens: int,
                    count_as_new: bool = True) -> None:
        if payloads:
            pipe.hset(self.keys.prompts, mapping=payloads)
            pipe.hset(self.keys.state, mapping={i: QUEUED for i in payloads})
            if count_as_new:
                pipe.hincrby(self.keys.counters, "enqueued", len(payloads))
                pipe.hincrby(self.keys.counters, "prompt_tokens", tokens)

    def mark_done(self, prompt_id: str, output_tokens: int) -> None:
        with self.client.pipeline() as pipe:
            pipe.hset(self.keys.state, prompt_id, DONE)
            pipe.hdel(self.keys.dead, prompt_id)
            pipe.hdel(self.keys.prompts, prompt_id)
            pipe.hincrby(self.keys.counters, "done", 1)
            pipe.hincrby(self.keys.counters, "output_tokens", output_tokens)
            minute = int(time.time() // 60)
            pipe.hincrby(self.keys.minutes, f"{minute}:samples", 1)
            pipe.hincrby(self.keys.minutes, f"{minute}:tokens", output_tokens)
            pipe.execute()

    def mark_dead(self, pipe: redis.client.Pipeline, prompt_id: str) -> None:
        pipe.hset(self.keys.state, prompt_id, DEAD)
        pipe.hdel(self.keys.prompts, prompt_id)

    def counts(self) -> dict[str, int]:
        """Prompts by state, counted from the ledger itself."""
        counts: dict[str, int] = {}
        for _, raw in self.client.hscan_iter(self.keys.state, count=1000):
            state = raw.decode()
            counts[state] = counts.get(state, 0) + 1
        return counts

    def recent(self, minutes: int = 5) -> tuple[int, int, float]:
        """Samples and output tokens stored in the current minute and the `minutes - 1`
        before it, and the seconds that window spans so far."""
        now = time.time()
        current = int(now // 60)
        fields = [f"{m}:{k}" for m in range(current - minutes + 1, current + 1) for k in ("samples", "tokens")]
        values = [int(v or 0) for v in self.client.hmget(self.keys.minutes, fields)]
        return sum(values[0::2]), sum(values[1::2]), (minutes - 1) * 60 + (now - current * 60)

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.counters).items()}
