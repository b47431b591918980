"""What a worker needs of a prompt's line beyond its token ids.

A line may carry its own `sampling` object (overriding the run's) and fields a
verifier reads (`answer`, say). The producer records them once per prompt, not
once per sample, in one hash of the run (`RunKeys.line_fields`), before it
publishes the prompt's samples, so a worker that takes any sample (first
delivery or the audit's republication) finds them. Only a run whose spec says
its lines carry fields (`RunSpec.line_fields`) reads the hash: a run without
them costs no extra read a sample.

The record is JSON: `{"sampling": {...}, "fields": {...}}`, each part present
only where the line gave one.
"""
from __future__ import annotations

import json

import redis

from contract.keys import RunKeys


class LineFields:
    """A run's per-line records, by prompt id."""

    def __init__(self, client: redis.Redis, run: str):
        self.client = client
        self.key = RunKeys(run).line_fields

    def add_new(self, records: dict[str, dict]) -> list[str]:
        """Record each line that has no record yet (one round trip); the ids recorded now. A record
        already there is kept: the first line of an id is the one its prompt was queued from."""
        if not records:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for pid, record in records.items():
                pipe.hsetnx(self.key, pid, json.dumps(record, separators=(",", ":"), sort_keys=True))
            created = pipe.execute()
        return [pid for pid, new in zip(records, created) if new]

    def drop(self, prompt_ids: list[str]) -> None:
        if prompt_ids:
            self.client.hdel(self.key, *prompt_ids)

    def get(self, prompt_id: str) -> dict:
        """The record of `prompt_id`'s line; empty where it has none."""
        raw = self.client.hget(self.key, prompt_id)
        return json.loads(raw) if raw else {}
