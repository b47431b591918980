"""Server bindings: the SGLang servers a worker sends to, and their true state.

Health is the HTTP status of `GET /health` (SGLang answers 200 with an empty
body, 503 while warming up, and refuses connections while loading), never its
body. A server that answers is then checked once before its first prompt
(preflight): the model it serves, whether it truncates prompts on its own, its
context length. A server that refuses the worker's credentials, at preflight or
on `/generate`, is refused until it goes down and comes back. Routing picks
the healthy server with the fewest requests in flight, below a per-server cap
sized for continuous batching.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from contract.connections import redact_url
from contract.names import ServerState

log = logging.getLogger(__name__)

UNKNOWN, LOADING, WARMING, HEALTHY = ServerState.UNKNOWN, ServerState.LOADING, ServerState.WARMING, ServerState.HEALTHY
DOWN, REFUSED = ServerState.DOWN, ServerState.REFUSED


@dataclass
class ServerBinding:
    url: str
    state: ServerState = UNKNOWN
    in_flight: int = 0
    failures: int = 0
    successes: int = 0
    model_path: str | None = None
    served_model_name: str | None = None
    max_model_len: int | None = None
    reasoning_parser: str | None = None
    vocab_size: int | None = None  # where the server reports one
    refusal: str | None = None
    last_error: str | None = None
    checked_at: float = 0.0
    preflighted: bool = False
    sent: int = field(default=0)

    @property
    def usable(self) -> bool:
        return self.state == HEALTHY and self.preflighted and self.refusal is None

    def serves(self, model: str | None) -> bool:
        return model is None or model in (self.model_path, self.served_model_name)

    def models(self) -> set[str]:
        return {m for m in (self.model_path, self.served_model_name) if m}

    def snapshot(self) -> dict:
        keep = ("url", "state", "in_flight", "model_path", "served_model_name", "max_model_len",
                "reasoning_parser", "refusal", "last_error", "checked_at", "sent")
        return {k: getattr(self, k) for k in keep}


class NoServer(Exception):
    """No healthy server for this prompt's model came free in time."""


class ServerPool:
    """The bindings of one worker process, shared by its task threads."""

    def __init__(self, urls: list[str], max_inflight: int):
        # Recorded redacted: credentials in a URL travel only in workers/server_auth.py.
        self.bindings = [ServerBinding(redact_url(u)) for u in urls]
        self.max_inflight = max_inflight
        self._cond = threading.Condition()

    def usable(self, model: str | None = None) -> list[ServerBinding]:
        return [b for b in self.bindings if b.usable and b.serves(model)]

    def healthy_models(self) -> set[str]:
        return set().union(*(b.models() for b in self.bindings if b.usable))

    def any_usable(self) -> bool:
        return any(b.usable for b in self.bindings)

    @contextmanager
    def acquire(self, model: str | None, wait: float, avoid: str | None = None) -> Iterator[ServerBinding]:
        """Hold a slot on the least-loaded usable server, waiting up to `wait` seconds."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                chosen = self._pick(model, avoid)
                if chosen:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoServer(f"no healthy server for model {model or 'any'} within {wait:.0f}s")
                self._cond.wait(min(left, 1.0))
            chosen.in_flight += 1
            chosen.sent += 1
        try:
            yield chosen
        finally:
            with self._cond:
                chosen.in_flight -= 1
                self._cond.notify()

    def _pick(self, model: str | None, avoid: str | None) -> ServerBinding | None:
        free = [b for b in self.usable(model) if b.in_flight < self.max_inflight]
        if not free:
            return None
        others = [b for b in free if b.url != avoid]
        return min(others or free, key=lambda b: b.in_flight)

    def changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def snapshot(self) -> list[dict]:
        return [b.snapshot() for b in self.bindings]
