"""A run's figures: the tallies of its samples and dead letters, read out as one JSON-able dict.

The dict is the report's single source of numbers: the charts are drawn from
it and the page embeds it whole (`<script id="report-data">`), so a reader (or
a test) can check any number on the page against the shards. Its keys are
stable; shares are fractions of the stored rows.
"""
from __future__ import annotations

import numpy as np

from contract.fleet.cache_hits import Hits
from contract.run.spec import RunSpec

from .letters import NO_GENERATION, LetterTally
from .samples import SampleTally
from .tally import FoldingGrid

HIST_BINS = 100


def figures(samples: SampleTally, letters: LetterTally, spec: RunSpec) -> dict:
    budget = spec.sampling.get("max_new_tokens")
    unique, repeated = _repeats(samples)
    rows = samples.rows
    return {
        "budget": budget,
        "samples": {"rows": rows, "unique_ids": unique, "duplicate_rows": rows - unique},
        "lengths": {name: _length(samples.lengths[name], budget if name != "prompt" else None)
                    for name in ("output", "reasoning", "answer", "prompt")},
        "finish": {"stored": dict(sorted(samples.finish.items())), "dead": dict(sorted(letters.finish.items()))},
        "closure": {"stored": dict(samples.closure), "dead": dict(letters.closure)},
        "quality": _quality(samples, letters, repeated, rows),
        "timeline": _timeline(samples, letters),
        "dead_letters": {"total": sum(letters.reasons.values()), "by_reason": dict(sorted(letters.reasons.items())),
                         "prompt_tokens": letters.prompt_tokens},
        "servers": _servers(samples),
        "cache": _cache(samples),
        "prompt_vs_output": _grid(samples.grid),
        "consistency": {name: {str(k): v for k, v in sorted(c.items(), key=lambda kv: -kv[1])}
                        for name, c in samples.values.items()},
        "attempts": {str(k): v for k, v in sorted(samples.attempts.items())},
        "examples": {**{name: p.ids() for name, p in samples.picks.items()},
                     **{f"dead:{reason}": p.ids() for reason, p in sorted(letters.picks.items())}},
    }


def repeated_hashes(samples: SampleTally) -> set[int]:
    """Output hashes stored for more than one prompt id."""
    pairs = _unique_pairs(samples)
    outs, counts = np.unique(pairs[:, 0], return_counts=True)
    return {int(h) for h in outs[counts > 1]}


def _unique_pairs(samples: SampleTally) -> np.ndarray:
    if not samples.hashes:
        return np.zeros((0, 2), dtype=np.uint64)
    return np.unique(np.concatenate(samples.hashes), axis=0)


def _repeats(samples: SampleTally) -> tuple[int, int]:
    """Distinct prompt ids, and how many of them share their output ids with another prompt."""
    pairs = _unique_pairs(samples)
    unique_ids = int(np.unique(pairs[:, 1]).size)
    _, counts = np.unique(pairs[:, 0], return_counts=True)
    return unique_ids, int(counts[counts > 1].sum())


def _length(counts, budget: int | None) -> dict:
    summary = counts.summary()
    upper = max(budget or 0, summary["max"] or 0, 1)
    return {**summary, "histogram": counts.bins(upper, HIST_BINS)}


def _quality(samples: SampleTally, letters: LetterTally, repeated: int, rows: int) -> dict:
    """Suspect answers in the dataset (counts, shares of the stored rows), and those the rules caught."""
    counts = {"empty_answer": samples.flags["empty_answer"], "repeated": repeated,
              "no_stop_token": samples.flags["no_stop_token"], "unclosed": samples.flags["unclosed"],
              "truncated": samples.flags["truncated"]}
    caught = {"empty_answer": letters.reasons["empty_answer"], "repeated": 0,
              "no_stop_token": sum(n for kind, n in letters.finish.items() if kind not in ("stop", NO_GENERATION)),
              "unclosed": letters.reasons["missing_think_end"], "truncated": letters.reasons["truncated"]}
    return {"counts": counts, "shares": {k: round(v / rows, 6) if rows else 0.0 for k, v in counts.items()},
            "dead_lettered": caught}


def _timeline(samples: SampleTally, letters: LetterTally) -> dict:
    grids = [samples.timeline, samples.tokens_timeline, samples.cached_timeline, samples.known_timeline,
             *letters.timelines.values()]
    width = max(g.widths[0] for g in grids)
    for grid in grids:
        grid.fold_to([width])
    length = max(g.used() for g in grids)
    series = lambda grid: [round(float(v), 3) for v in grid.sums[:length]]  # noqa: E731
    return {"width_s": width, "samples": series(samples.timeline), "output_tokens": series(samples.tokens_timeline),
            "cached_tokens": series(samples.cached_timeline), "known_prompt_tokens": series(samples.known_timeline),
            "dead_by_reason": {r: series(g) for r, g in sorted(letters.timelines.items())}}


def _servers(samples: SampleTally) -> list[dict]:
    rows = []
    for name, s in sorted(samples.servers.items()):
        span = max((s.last_finished or 0) - (s.first_started or 0), 1e-3)
        latency = s.latency
        rows.append({"server": name, "samples": s.samples, "output_tokens": s.output_tokens,
                     "busy_s": round(span, 3), "tokens_per_s": round(s.output_tokens / span, 2),
                     "samples_per_s": round(s.samples / span, 4),
                     "latency_s": {"n": latency.n, "mean": round(latency.sum / latency.n, 4) if latency.n else None,
                                   "p50": _round(latency.quantile(0.5)), "p90": _round(latency.quantile(0.9)),
                                   "p99": _round(latency.quantile(0.99)), "max": _round(latency.max)},
                     "cache": {**s.hits.to_dict(), "share": s.hits.share}})
    return rows


def _cache(samples: SampleTally) -> dict:
    """Prefix-cache hits of the stored rows: Σ cached / Σ prompt tokens over the rows that say."""
    total = Hits()
    for server in samples.servers.values():
        total.merge(server.hits)
    return {**total.to_dict(), "share": total.share, "rows_known": samples.cache_rows_known, "rows": samples.rows}


def _grid(grid: FoldingGrid) -> dict:
    rows, cols = max(grid.used(0), 1), max(grid.used(1), 1)
    return {"prompt_width": grid.widths[0], "output_width": grid.widths[1],
            "counts": grid.sums[:rows, :cols].astype(int).tolist()}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
