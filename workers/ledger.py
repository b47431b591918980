"""Where each prompt of a run stands: queued, done or dead.

The producer marks prompts queued when it publishes them and skips prompts
already in the ledger on a re-run; workers mark them done once their sample is
durable in a shard (which also clears an earlier dead letter).
"""
from __future__ import annotations

import redis

from .runs import DONE, QUEUED, RunKeys


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

    def mark_queued(self, pipe: redis.client.Pipeline, prompt_ids: list[str], tokens: int) -> None:
        if prompt_ids:
            pipe.hset(self.keys.state, mapping={i: QUEUED for i in prompt_ids})
            pipe.hincrby(self.keys.counters, "enqueued", len(prompt_ids))
            pipe.hincrby(self.keys.counters, "prompt_tokens", tokens)

    def mark_done(self, prompt_id: str, output_tokens: int) -> None:
        with self.client.pipeline() as pipe:
            pipe.hset(self.keys.state, prompt_id, DONE)
            pipe.hdel(self.keys.dead, prompt_id)
            pipe.hincrby(self.keys.counters, "done", 1)
            pipe.hincrby(self.keys.counters, "output_tokens", output_tokens)
            pipe.execute()

    def counts(self) -> dict[str, int]:
        """Prompts by state, counted from the ledger itself."""
        counts: dict[str, int] = {}
        for _, raw in self.client.hscan_iter(self.keys.state, count=1000):
            state = raw.decode()
            counts[state] = counts.get(state, 0) + 1
        return counts

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.counters).items()}
