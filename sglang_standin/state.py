"""What the route handlers share: config, counters, scheduler, lifecycle.

Lifecycle mirrors SGLang's `ServerStatus`: "Starting" (port open, warm-up
running, health 503), "Up", and graceful exit after SIGTERM (health 503,
running requests finish, then the process exits 0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_standin.auth import ApiKey
from sglang_standin.batching import Engine
from sglang_standin.config import StandinConfig
from sglang_standin.stats import Stats
from sglang_standin.wedge import Wedge


class Lifecycle:
    """Warm-up window, draining flag and in-flight non-streaming /generate count."""

    def __init__(self, warmup_seconds: float) -> None:
        self._warmup = warmup_seconds
        self._listening_since: float | None = None
        self.draining = False
        self.inflight = 0

    def mark_listening(self) -> None:
        """The port is bound: warm-up starts now."""
        self._listening_since = time.monotonic()

    @property
    def warming(self) -> bool:
        since = self._listening_since
        return since is None or time.monotonic() - since < self._warmup

    @property
    def healthy(self) -> bool:
        return not self.draining and not self.warming


@dataclass
class StandinState:
    """Stored on `app.state.standin`; one per server process."""

    cfg: StandinConfig
    stats: Stats = field(default_factory=Stats)
    lifecycle: Lifecycle | None = None
    engine: Engine | None = None
    wedge: Wedge | None = None
    api_key: ApiKey | None = None  # the key in force, from --api-key (rotated by POST /standin/api-key)
    created: int = field(default_factory=lambda: int(time.time()))
    rids: set[str] = field(default_factory=set)  # given rids in flight: another request may not reuse one
    # /server_info's weight_version once /update_weight_version changed the current one: the launch
    # value, as SGLang 0.5.23 keeps it there (only /model_info and the answers report the new one)
    launch_weight_version: str | None = None

    def __post_init__(self) -> None:
        if self.lifecycle is None:
            self.lifecycle = Lifecycle(self.cfg.warmup_seconds)
        if self.engine is None:
            self.engine = Engine(self.cfg, self.stats)
        if self.wedge is None:
            self.wedge = Wedge(self.cfg.wedge, self.cfg.wedge_trickle_seconds)
        if self.api_key is None and self.cfg.api_key:
            self.api_key = ApiKey(self.cfg.api_key)
