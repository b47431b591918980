"""Counters behind `GET /standin/stats`.

Tests use them to prove retries really reached the server (attempts vs
generations per prompt) and benchmarks to measure how busy the "GPU" was
(busy_seconds over the window first_start..last_end). `bad_outputs`,
`trickled` and `wedged` say which prompts got those faults, keyed like
`attempts` (the rid when the request gave one, else the prompt's sha256).
`prompt_tokens` and `cached_tokens` are the two /metrics counters (`metrics`).
`generating` lists the keys whose generation has started and not been answered
yet (a fault test's "what was being generated at the instant it struck");
`asked` keeps, per key, what its last request asked besides its ids (its
`sampling_params` and log-probability fields, as sent): a test sees there the
sampling a client really sent. `spans` gives, per key generated more than once, each generation's start and
end (wall clock, `time.time()`; end null while it runs, or when its client left
and the stand-in has not noticed yet): a test tells by them whether a second
generation began while the first still ran, or after it was answered.
`seeds` gives, per key, the `sampling_seed` of each generation that carried
one (a test of samples checks the seeds a worker sent).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict


class Stats:
    """Mutable counters; only touched from the event loop thread."""

    def __init__(self) -> None:
        self.requests = 0
        self.attempts: dict[str, int] = defaultdict(int)
        self.generations: dict[str, int] = defaultdict(int)
        self.generating: dict[str, int] = defaultdict(int)  # started and not yet answered (fault tests)
        self.spans: dict[str, list[list[float | None]]] = defaultdict(list)  # [start, end] of each generation
        self.seeds: dict[str, list[int]] = defaultdict(list)  # sampling_seed of each generation that had one
        self.bad_outputs: dict[str, list[str]] = defaultdict(list)
        self.trickled: dict[str, int] = defaultdict(int)
        self.wedged: dict[str, int] = defaultdict(int)
        self.asked: dict[str, dict] = {}  # key -> its last request's sampling_params and logprob fields
        self._asks: dict[str, dict] = {}  # each distinct ask once, by its JSON text
        self.tokens_generated = 0
        self.prompt_tokens = 0  # /metrics sglang:prompt_tokens_total
        self.cached_tokens = 0  # /metrics sglang:cached_tokens_total
        self.first_start: float | None = None
        self.last_end: float | None = None
        self._busy_total = 0.0
        self._busy_since: float | None = None

    def note_request(self) -> None:
        """One HTTP request reached /generate (whatever became of it)."""
        self.requests += 1

    def note_attempt(self, key: str) -> int:
        """A valid request for prompt `key`; returns its 1-based attempt number."""
        self.attempts[key] += 1
        return self.attempts[key]

    def note_generation(self, key: str, seed: int | None = None) -> None:
        """A generation for `key` was started (not a fault-injected 500/503), with `seed` as its sampling_seed."""
        if seed is not None:
            self.seeds[key].append(seed)
        self.generations[key] += 1
        self.generating[key] += 1
        self.spans[key].append([time.time(), None])

    def note_answered(self, key: str) -> None:
        """The generation for `key` ended (answered, or its client left)."""
        self.generating[key] -= 1
        if self.generating[key] <= 0:
            del self.generating[key]
        for span in self.spans.get(key, ()):
            if span[1] is None:  # the oldest one still open
                span[1] = time.time()
                break

    def note_asked(self, key: str, asked: dict) -> None:
        """What a valid request for `key` asked besides its ids (the last one's is kept). Equal asks are
        kept once (a run sends most of its prompts alike), so a benchmark of 10^6 prompts holds a
        reference a key, as `attempts` holds a count."""
        text = json.dumps(asked, sort_keys=True)
        self.asked[key] = self._asks.setdefault(text, asked)

    def note_bad_output(self, key: str, kind: str) -> None:
        """An answer for `key` was sent with the bad-output fault `kind`."""
        self.bad_outputs[key].append(kind)

    def note_trickle(self, key: str) -> None:
        """An answer for `key` was sent with the trickle fault."""
        self.trickled[key] += 1

    def note_wedged(self, key: str) -> None:
        """A request for `key` was held by the wedge fault."""
        self.wedged[key] += 1

    def note_started(self) -> None:
        """A request entered the running batch."""
        if self.first_start is None:
            self.first_start = time.time()

    def note_finished(self, tokens: int) -> None:
        """A request left the running batch after producing `tokens` tokens."""
        self.tokens_generated += tokens
        self.last_end = time.time()

    def note_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A scheduled request finished: count its prompt as SGLang's metrics do, on finish."""
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens

    def set_busy(self, busy: bool) -> None:
        """Track time with at least one running request (monotonic clock)."""
        now = time.monotonic()
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            self._busy_total += now - self._busy_since
            self._busy_since = None

    def busy_seconds(self) -> float:
        """Busy time so far, including a busy period still under way."""
        open_part = 0.0 if self._busy_since is None else time.monotonic() - self._busy_since
        return self._busy_total + open_part

    def snapshot(self, running: int, waiting: int) -> dict:
        """The JSON body of /standin/stats."""
        return {
            "requests": self.requests,
            "generations": dict(self.generations),
            "generating": sorted(self.generating),
            "spans": {k: [list(span) for span in v] for k, v in self.spans.items() if len(v) > 1},
            "attempts": dict(self.attempts),
            "seeds": {k: list(v) for k, v in self.seeds.items()},
            "bad_outputs": {k: list(v) for k, v in self.bad_outputs.items()},
            "trickled": dict(self.trickled),
            "wedged": dict(self.wedged),
            "asked": dict(self.asked),
            "tokens_generated": self.tokens_generated,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "busy_seconds": self.busy_seconds(),
            "first_start": self.first_start,
            "last_end": self.last_end,
            "running": running,
            "waiting": waiting,
        }
