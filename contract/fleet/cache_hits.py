"""Prefix-cache hits: the share of prompt tokens a server found in its radix cache.

SGLang keeps the KV of prompts it has computed in a radix tree and skips the
prefill of any prefix it finds there; each `/generate` answer says how many
prompt tokens that was (`meta_info.cached_tokens`). The hit share of a server
is Σ cached tokens / Σ prompt tokens over its generations (not SGLang's
`cache_hit_rate` gauge, which is the last prefill batch's alone).

Invariant: a share is computed only over generations whose `cached_tokens` is
known, so a generation from a server that does not report it (an older
release, `--disable-radix-cache`) neither lowers nor raises it, and a server
with no known figure has no share (`None`, shown as `-`), never 0%. Every
figure here is a sum, so the tallies of several workers (or shards, or time
buckets) merge by adding them: the worker's heartbeat, `status` and the run
report all use this one shape and this one `share`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

WINDOW_S = 300  # the window `status` shows: each worker's tally of its last 5 minutes


@dataclass
class Hits:
    """Sums over some generations of one server: all their prompt tokens, the prompt tokens of
    those whose `cached_tokens` is known, and those cached tokens."""
    prompt_tokens: int = 0
    known_prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, prompt_len: int, cached: int | None) -> None:
        self.prompt_tokens += prompt_len
        if cached is not None:
            self.known_prompt_tokens += prompt_len
            self.cached_tokens += cached

    def merge(self, other: "Hits") -> None:
        self.prompt_tokens += other.prompt_tokens
        self.known_prompt_tokens += other.known_prompt_tokens
        self.cached_tokens += other.cached_tokens

    @property
    def share(self) -> float | None:
        return share(self.cached_tokens, self.known_prompt_tokens)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Hits":
        """A heartbeat's entry; a missing or malformed figure counts 0 (a heartbeat is advisory)."""
        def number(key: str) -> int:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
        return cls(number("prompt_tokens"), number("known_prompt_tokens"), number("cached_tokens"))


def share(cached_tokens: float, known_prompt_tokens: float) -> float | None:
    """Cached over known prompt tokens, rounded to 4 places; None when no prompt token's figure is known."""
    return round(cached_tokens / known_prompt_tokens, 4) if known_prompt_tokens > 0 else None


def share_text(share: float | None) -> str:
    """A share as `status` and the report print it: `37.5%`, or `-` where unknown."""
    return "-" if share is None else f"{100 * share:.1f}%"


def merge_servers(reports: Iterable[dict | None], servers: Iterable[str] = ()) -> list[dict]:
    """Per server, the sum of every worker's window (`reports`: each heartbeat's `cache_hits`);
    `servers` (the URLs the workers are bound to) are listed too, with no share while nothing
    came back from them in the window. Sorted by server."""
    merged: dict[str, Hits] = {url: Hits() for url in servers}
    reporting: dict[str, int] = {}
    for report in reports:
        if not isinstance(report, dict) or not isinstance(report.get("servers"), dict):
            continue  # an older worker's heartbeat has none
        for url, figures in report["servers"].items():
            if isinstance(figures, dict):
                merged.setdefault(url, Hits()).merge(Hits.from_dict(figures))
                reporting[url] = reporting.get(url, 0) + 1
    return [{"server": url, **hits.to_dict(), "share": hits.share, "workers": reporting.get(url, 0)}
            for url, hits in sorted(merged.items())]
