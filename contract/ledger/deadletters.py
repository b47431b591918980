"""The dead-letter queue: every prompt that could not produce a usable sample.

One Redis hash per run, keyed by prompt id, so a redelivered failure replaces
its entry instead of adding a second one, and a prompt that later succeeds is
removed. An entry holds what is needed to understand the failure and to replay
the prompt: the reason code, a human message, attempts, servers tried, the
task payload and an excerpt of the offending output.

This module is the letters' format and their reader; the run's `Ledger` owns
the hash and makes every change to it in the same atomic step as the prompt's
state and counts (`put` is `Ledger.bury`, `remove` is `Ledger.purge`), so a
letter exists exactly while its prompt is dead and `stats` and `count` are O(1).

A run may hold millions of letters, so nothing here gathers them: `scan` and
`pages` stream them a page of HSCAN at a time (in the hash's order, not by id),
and the commands list, replay and purge page by page as they scan.
"""
from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable, Iterator

import redis

from contract.keys import RunKeys
from contract.ledger.ledger import Ledger
from contract.run.samples import key_of, split_sample_key

log = logging.getLogger(__name__)
_UNKNOWN_WARNED: set[str] = set()  # fields of letters this process has warned about


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
    sample: int | None = None  # the sample's index in a run of several samples a prompt; else None

    @property
    def key(self) -> str:
        """The ledger key of the letter's prompt, or of its sample (`contract/run/samples.py`)."""
        return key_of(self.id, self.sample)

    def of_sample(self, samples: int) -> "DeadLetter":
        """The letter made for ledger key `id` in a run of `samples` samples a prompt, naming
        its prompt's id and its sample (a no-op where it does already, or in a run of one)."""
        if samples > 1 and self.sample is None:
            self.id, self.sample = split_sample_key(self.id, samples)
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> "DeadLetter":
        """A letter as stored; fields this version does not know (a newer worker wrote them)
        are left out, with a warning the first time each is met, so the letter is still listed."""
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - _UNKNOWN_WARNED)
        if unknown:
            _UNKNOWN_WARNED.update(unknown)
            log.warning("dead letters hold fields this version does not know, left out: %s", ", ".join(unknown))
        return cls(**{k: v for k, v in data.items() if k in known})

    def summary(self) -> dict:
        """The listing's view: everything but the payload."""
        data = asdict(self)
        data.pop("prompt_b64")
        return data


class DeadLetters:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run = client, run
        self.keys = RunKeys(run)  # for reading only; the ledger makes every change
        self.ledger = Ledger(client, run)

    def put(self, letter: DeadLetter, forgotten: bool = False) -> str | None:
        """Store the letter unless its prompt is already done; returns the state the prompt
        was in (queued or dead: stored; done or None: left as it was). `forgotten`: see `Ledger.bury`."""
        return self.ledger.bury(letter.key, letter.reason, letter.to_json(), forgotten)

    def get(self, prompt_id: str) -> DeadLetter | None:
        """The letter of a ledger key (a prompt's id, or a sample's `<id>~<index>`)."""
        raw = self.ledger.letter(prompt_id)
        return DeadLetter.from_json(raw) if raw else None

    def __iter__(self) -> Iterator[DeadLetter]:
        return self.scan()

    def scan(self, reasons: Iterable[str] | None = None, page: int = 500) -> Iterator[DeadLetter]:
        """Every letter (of these reasons), streamed a page of HSCAN at a time."""
        wanted = set(reasons or ())
        for _, raw in self.ledger.letters(page):
            letter = DeadLetter.from_json(raw)
            if not wanted or letter.reason in wanted:
                yield letter

    def in_order(self, reasons: Iterable[str] | None = None, page: int = 500) -> Iterator[DeadLetter]:
        """Every letter (of these reasons) by prompt id, then sample: the order `dead list` states,
        the same on every call whatever the hash's own order. One pass of HSCAN keeps only the
        matching letters' keys; the letters are then read a page of HMGET at a time (one purged
        meanwhile is left out)."""
        wanted = set(reasons or ())
        keys = []
        for key, raw in self.ledger.letters(page):
            letter = DeadLetter.from_json(raw)
            if not wanted or letter.reason in wanted:
                keys.append(((letter.id, letter.sample or 0), key))
        keys.sort()
        for start in range(0, len(keys), page):
            chunk = [key for _, key in keys[start:start + page]]
            for raw in self.ledger.client.hmget(self.keys.dead, chunk):
                if raw:
                    yield DeadLetter.from_json(raw)

    def pages(self, reasons: Iterable[str] | None = None, size: int = 500) -> Iterator[list[DeadLetter]]:
        """`scan` in lists of at most `size` letters, for replaying or purging as it goes."""
        page: list[DeadLetter] = []
        for letter in self.scan(reasons, size):
            page.append(letter)
            if len(page) >= size:
                yield page
                page = []
        if page:
            yield page

    def select(self, reasons: list[str] | None = None, ids: list[str] | None = None,
               limit: int | None = None) -> list[DeadLetter]:
        """Letters by id (`ids`), or the first `limit` the scan meets, sorted by id. Without
        a limit this holds every letter: the commands stream with `scan` instead."""
        if ids:
            found = [letter for letter in (self.get(i) for i in ids) if letter]
            found = [letter for letter in found if not reasons or letter.reason in reasons]
        else:
            found = list(itertools.islice(self.scan(reasons), limit))
        return sorted(found, key=lambda letter: (letter.id, letter.sample or 0))

    def stats(self) -> dict[str, int]:
        """Dead letters by reason, from the ledger's counts."""
        return dict(self.ledger.tally().reasons)

    def scan_stats(self) -> dict[str, int]:
        """The same, counted letter by letter: a slow check of `stats`."""
        counts: dict[str, int] = {}
        for letter in self:
            counts[letter.reason] = counts.get(letter.reason, 0) + 1
        return dict(sorted(counts.items()))

    def remove(self, prompt_ids: list[str]) -> int:
        """Delete letters (`dead purge`); their prompts stay dead."""
        return self.ledger.purge(prompt_ids)

    def count(self, reasons: Iterable[str] | None = None) -> int:
        """How many letters (of these reasons), from the counts."""
        stats = self.stats()
        return sum(n for reason, n in stats.items() if not reasons or reason in set(reasons))
