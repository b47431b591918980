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

from .keys import RunKeys


class LineFields:
    """A run's per-line records, by prompt id."""

    def __init__(self, client: redis.Redis, run: str):
        self.client = client
        self.key = RunKeys(run).line_fields

    def put(self, pipe, records: dict[str, dict], keep: bool = False) -> None:
        """Add `records` (prompt id -> record) to `pipe` (a pipeline the caller executes). `keep`:
        a record already there stays (HSETNX), so a later line repeating an id (a duplicate, which
        the ledger does not queue) never replaces the record of the line whose prompt it queued."""
        if not records:
            return
        encoded = {pid: json.dumps(r, separators=(",", ":"), sort_keys=True) for pid, r in records.items()}
        if not keep:
            pipe.hset(self.key, mapping=encoded)
            return
        for pid, record in encoded.items():
            pipe.hsetnx(self.key, pid, record)

    def get(self, prompt_id: str) -> dict:
        """The record of `prompt_id`'s line; empty where it has none."""
        raw = self.client.hget(self.key, prompt_id)
        return json.loads(raw) if raw else {}
