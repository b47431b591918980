"""The dead-letter queue: every prompt that could not produce a usable sample.

One Redis hash per run, keyed by prompt id, so a redelivered failure replaces
its entry instead of adding a second one, and a prompt that later succeeds is
removed (`ledger.mark_done`). An entry holds what is needed to understand the
failure and to replay the prompt: the reason code, a human message, attempts,
servers tried, the task payload and an excerpt of the offending output.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import redis

from .keys import RunKeys
from .ledger import Ledger


@dataclass
class DeadLetter:
    id: str
    run: str
    reason: str
    message: str
    attempts: int
    servers: list[str]
    worker: str
    prompt_b64: str
    prompt_tokens: int
    sampling: dict
    excerpt: dict = field(default_factory=dict)
    first_attempt_at: float = 0.0
    dead_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "DeadLetter":
        return cls(**json.loads(raw))

    def summary(self) -> dict:
        """The listing's view: everything but the payload."""
        data = asdict(self)
        data.pop("prompt_b64")
        return data


class DeadLetters:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run, self.keys = client, run, RunKeys(run)

    def put(self, letter: DeadLetter) -> None:
        with self.client.pipeline() as pipe:
            pipe.hset(self.keys.dead, letter.id, letter.to_json())
            Ledger(self.client, self.run).mark_dead(pipe, letter.id)
            pipe.execute()

    def get(self, prompt_id: str) -> DeadLetter | None:
        raw = self.client.hget(self.keys.dead, prompt_id)
        return DeadLetter.from_json(raw) if raw else None

    def __iter__(self) -> Iterator[DeadLetter]:
        for _, raw in self.client.hscan_iter(self.keys.dead, count=500):
            yield DeadLetter.from_json(raw)

    def select(self, reasons: list[str] | None = None, ids: list[str] | None = None) -> list[DeadLetter]:
        if ids:
            letters = [self.get(i) for i in ids]
            found = [letter for letter in letters if letter]
        else:
            found = list(self)
        if reasons:
            found = [letter for letter in found if letter.reason in reasons]
        return sorted(found, key=lambda letter: letter.id)

    def stats(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for letter in self:
            counts[letter.reason] = counts.get(letter.reason, 0) + 1
        return dict(sorted(counts.items()))

    def remove(self, prompt_ids: list[str]) -> int:
        if not prompt_ids:
            return 0
        return int(self.client.hdel(self.keys.dead, *prompt_ids))

    def count(self) -> int:
        return int(self.client.hlen(self.keys.dead))
