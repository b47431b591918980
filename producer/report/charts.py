"""The report's charts: matplotlib drawn to SVG, inlined in the page.

Why matplotlib to SVG (and not plotly or Altair/Vega-Lite): the page must open
from a file with nothing fetched, ever. An SVG drawn here is finished when the
page is written: no JavaScript runs to draw it, so it shows the same in any
browser, with scripts blocked, in a CI artifact viewer or a mail attachment,
and there is no CDN link to forget. Plotly's offline mode would inline about
4.7 MB of plotly.js into every report; Altair needs the vl-convert binary
(tens of MB) to inline Vega's scripts. The charts are drawn from bounded
tallies (histograms, not points), so zoom and hover would add little; the
exact numbers are in the page's tables and its JSON block. matplotlib installs
from PyPI as wheels, and only the report imports it (the Agg-free `Figure`
API: no pyplot, no global state).

Each chart marks its data (bars, lines, the heat map) with ids
`mark-<chart>-<n>`, and `draw` returns how many, so a test can check in a real
browser that every chart drew what it should.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import numpy as np

PALETTE = {"stored": "#4C78A8", "dead": "#E45756", "budget": "#B279A2", "accent": "#F58518",
           "ok": "#54A24B", "muted": "#9D9D9D"}
REASON_COLORS = ["#E45756", "#F58518", "#B279A2", "#72B7B2", "#EECA3B", "#FF9DA6", "#9D755D", "#BAB0AC",
                 "#4C78A8", "#54A24B", "#79706E", "#D67195", "#1F77B4", "#8C564B", "#17BECF"]


@dataclass(frozen=True)
class Chart:
    name: str
    title: str
    healthy: str
    draw: Callable


class _Canvas:
    """One figure, and the ids it gives its data marks."""

    def __init__(self, name: str, size: tuple[float, float] = (6.4, 3.0)):
        from matplotlib.figure import Figure

        self.name, self.marks = name, 0
        self.fig = Figure(figsize=size, layout="constrained")
        self.ax = self.fig.subplots()
        for side in ("top", "right"):
            self.ax.spines[side].set_visible(False)

    def mark(self, artists) -> None:
        for artist in artists:
            artist.set_gid(f"mark-{self.name}-{self.marks}")
            self.marks += 1

    def nothing(self, message: str) -> None:
        self.ax.set_axis_off()
        self.ax.text(0.5, 0.5, message, ha="center", va="center", color=PALETTE["muted"],
                     transform=self.ax.transAxes)

    def svg(self) -> str:
        import matplotlib

        buffer = io.StringIO()
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": self.name, "font.size": 9}):
            self.fig.savefig(buffer, format="svg", metadata={"Date": None})
        text = buffer.getvalue()
        return text[text.index("<svg"):]


def draw(chart: Chart, data: dict) -> tuple[str, int]:
    """The chart's SVG and its number of data marks."""
    import matplotlib

    with matplotlib.rc_context({"font.size": 9, "axes.titlesize": 10}):
        canvas = _Canvas(chart.name)
        chart.draw(canvas, data)
        return canvas.svg(), canvas.marks


def _bars(canvas: _Canvas, x, heights, width, bottom=None, **style):
    heights = np.asarray(heights, dtype=float)
    bars = canvas.ax.bar(x, heights, width=width, bottom=bottom, align="edge", **style)
    canvas.mark(bar for bar, h in zip(bars, heights) if h > 0)
    return bars


def _length(name: str, label: str) -> Callable:
    def draw_length(canvas: _Canvas, data: dict) -> None:
        lengths, budget = data["lengths"][name], data["budget"]
        if not lengths["n"]:
            canvas.nothing("no samples yet")
            return
        hist = lengths["histogram"]
        _bars(canvas, hist["edges"], hist["counts"], hist["width"], color=PALETTE["stored"])
        if budget:
            line = canvas.ax.axvline(budget, color=PALETTE["budget"], linestyle="--", linewidth=1.2)
            canvas.mark([line])
            canvas.ax.annotate(f"max_new_tokens {budget:,}", (budget, 1), xycoords=("data", "axes fraction"),
                               xytext=(-4, 0), textcoords="offset points", ha="right", va="top",
                               color=PALETTE["budget"], fontsize=8)
        canvas.ax.set_xlabel(f"{label} (tokens); p50 {lengths['p50']:,}, p90 {lengths['p90']:,}, "
                             f"max {lengths['max']:,}")
        canvas.ax.set_ylabel("samples")
    return draw_length


def _finish(canvas: _Canvas, data: dict) -> None:
    stored, dead = data["finish"]["stored"], data["finish"]["dead"]
    kinds = sorted(set(stored) | set(dead), key=lambda k: -(stored.get(k, 0) + dead.get(k, 0)))
    if not kinds:
        canvas.nothing("no generations yet")
        return
    y = np.arange(len(kinds))
    s = [stored.get(k, 0) for k in kinds]
    d = [dead.get(k, 0) for k in kinds]
    canvas.mark(b for b, v in zip(canvas.ax.barh(y, s, color=PALETTE["stored"], label="stored"), s) if v)
    canvas.mark(b for b, v in zip(canvas.ax.barh(y, d, left=s, color=PALETTE["dead"], label="dead-lettered"), d) if v)
    canvas.ax.set_yticks(y, kinds)
    canvas.ax.invert_yaxis()
    canvas.ax.set_xlabel("generations")
    canvas.ax.legend(frameon=False, fontsize=8)


def _closure(canvas: _Canvas, data: dict) -> None:
    stored, dead = data["closure"]["stored"], data["closure"]["dead"]
    kinds = [k for k in ("one", "none", "several", "no generation") if stored.get(k) or dead.get(k)]
    if not kinds:
        canvas.nothing("no generations yet")
        return
    labels = {"one": "one think-end", "none": "no think-end", "several": "several think-ends",
              "no generation": "no generation (server, prompt or worker)"}
    y = np.arange(len(kinds))
    s = [stored.get(k, 0) for k in kinds]
    d = [dead.get(k, 0) for k in kinds]
    canvas.mark(b for b, v in zip(canvas.ax.barh(y, s, color=PALETTE["stored"], label="stored"), s) if v)
    canvas.mark(b for b, v in zip(canvas.ax.barh(y, d, left=s, color=PALETTE["dead"], label="dead-lettered"), d) if v)
    canvas.ax.set_yticks(y, [labels[k] for k in kinds])
    canvas.ax.invert_yaxis()
    canvas.ax.set_xlabel("generations")
    canvas.ax.legend(frameon=False, fontsize=8)


def _time_axis(width: float, n: int) -> tuple[np.ndarray, float, str]:
    """Bucket start times in a readable unit, the bucket width in it, and the unit's name."""
    span = width * n
    unit, label = (1, "s") if span <= 600 else (60, "min") if span <= 3 * 3600 else (3600, "h")
    return np.arange(n) * width / unit, width / unit, label


def _dead_over_time(canvas: _Canvas, data: dict) -> None:
    series, width = data["timeline"]["dead_by_reason"], data["timeline"]["width_s"]
    if not series:
        canvas.nothing("no dead letters")
        return
    n = max(len(v) for v in series.values())
    x, bar_width, unit = _time_axis(width, n)
    bottom = np.zeros(n)
    for k, (reason, counts) in enumerate(series.items()):
        counts = np.pad(np.asarray(counts, dtype=float), (0, n - len(counts)))
        _bars(canvas, x, counts, bar_width, bottom=bottom, color=REASON_COLORS[k % len(REASON_COLORS)],
              label=f"{reason} ({int(counts.sum())})")
        bottom += counts
    canvas.ax.set_xlabel(f"time since the run began ({unit}); one bar per {_duration(width)}")
    canvas.ax.set_ylabel("dead letters")
    canvas.ax.legend(frameon=False, fontsize=7)


def _throughput(canvas: _Canvas, data: dict) -> None:
    timeline = data["timeline"]
    samples, tokens, width = timeline["samples"], timeline["output_tokens"], timeline["width_s"]
    if not any(samples):
        canvas.nothing("no samples yet")
        return
    x, step, unit = _time_axis(width, len(samples))
    edges = np.append(x, x[-1] + step)
    canvas.fig.clear()  # two panels on one time axis: samples/s above, output tokens/s below
    top, bottom = canvas.fig.subplots(2, 1, sharex=True)
    for ax, values, color, label in ((top, samples, PALETTE["stored"], "samples/s"),
                                     (bottom, tokens, PALETTE["accent"], "output tokens/s")):
        rate = np.asarray(values, dtype=float) / width
        (line,) = ax.step(edges, np.append(rate, rate[-1]), where="post", color=color)
        canvas.mark([line])
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    bottom.set_xlabel(f"time since the run began ({unit}); one step per {_duration(width)}")


def _server_throughput(canvas: _Canvas, data: dict) -> None:
    servers = data["servers"]
    if not servers:
        canvas.nothing("no samples yet")
        return
    y = np.arange(len(servers))
    rates = [s["tokens_per_s"] for s in servers]
    bars = canvas.ax.barh(y, rates, color=PALETTE["stored"])
    canvas.mark(b for b, r in zip(bars, rates) if r > 0)
    for yi, s in zip(y, servers):
        canvas.ax.annotate(f"{s['samples']:,} samples, {s['output_tokens']:,} tokens", (s["tokens_per_s"], yi),
                           xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    canvas.ax.set_xlim(0, max(max(rates), 1e-9) * 1.5)
    canvas.ax.set_yticks(y, [s["server"] for s in servers])
    canvas.ax.invert_yaxis()
    canvas.ax.set_xlabel("output tokens/s over the server's busy span (first start to last finish)")


def _server_latency(canvas: _Canvas, data: dict) -> None:
    servers = [s for s in data["servers"] if s["latency_s"]["n"]]
    if not servers:
        canvas.nothing("no latencies recorded yet")
        return
    y = np.arange(len(servers))
    for key, color, marker in (("p50", PALETTE["stored"], "o"), ("p90", PALETTE["accent"], "s"),
                               ("p99", PALETTE["dead"], "^"), ("max", PALETTE["muted"], "x")):
        values = [s["latency_s"][key] for s in servers]
        (line,) = canvas.ax.plot(values, y, linestyle="none", marker=marker, color=color, label=key)
        canvas.mark([line])
    canvas.ax.set_yticks(y, [s["server"] for s in servers])
    canvas.ax.set_xlabel("end-to-end latency of one generation (s, SGLang's e2e_latency)")
    canvas.ax.set_ylim(len(servers) - 0.5, -0.5)
    canvas.ax.legend(frameon=False, fontsize=8, ncols=4, loc="lower left", bbox_to_anchor=(0, 1.0))


NO_CACHE_FIGURES = "no prefix-cache figures: the servers did not report meta_info.cached_tokens"


def _cache_per_server(canvas: _Canvas, data: dict) -> None:
    """Each server's hit share as a dot on a bar from 0 (a dot at 0% is drawn too), all servers first."""
    rows = [("all servers", data["cache"])] + [(s["server"], s["cache"]) for s in data["servers"]]
    rows = [(name, hits) for name, hits in rows if hits["share"] is not None]
    if not rows:
        canvas.nothing(NO_CACHE_FIGURES)
        return
    y = np.arange(len(rows))
    values = np.array([100 * hits["share"] for _, hits in rows])
    colors = [PALETTE["accent"]] + [PALETTE["stored"]] * (len(rows) - 1)
    canvas.ax.hlines(y, 0, values, color=colors, linewidth=3)
    canvas.mark([canvas.ax.scatter(values, y, color=colors, s=36, zorder=3)])
    for yi, (_, hits), value in zip(y, rows, values):
        canvas.ax.annotate(f"{hits['cached_tokens']:,} of {hits['known_prompt_tokens']:,} prompt tokens", (value, yi),
                           xytext=(5, 0), textcoords="offset points", va="center", fontsize=7)
    canvas.ax.set_yticks(y, [name for name, _ in rows])
    canvas.ax.invert_yaxis()
    canvas.ax.set_xlim(0, 130)
    canvas.ax.set_xlabel("prompt tokens found in the server's prefix cache (%, of the samples that say)")


def _cache_over_time(canvas: _Canvas, data: dict) -> None:
    timeline = data["timeline"]
    cached, known = (np.asarray(timeline[k], dtype=float) for k in ("cached_tokens", "known_prompt_tokens"))
    if not known.sum():
        canvas.nothing(NO_CACHE_FIGURES)
        return
    width = timeline["width_s"]
    x, step, unit = _time_axis(width, len(known))
    share = np.divide(100 * cached, known, out=np.full(known.size, np.nan), where=known > 0)
    (line,) = canvas.ax.step(np.append(x, x[-1] + step), np.append(share, share[-1]), where="post",
                             color=PALETTE["accent"], marker="o", markersize=2.5)  # a lone bucket shows too
    canvas.mark([line])
    canvas.ax.set_xlim(0, x[-1] + step)  # the whole run, also where no sample said (a gap in the line)
    canvas.ax.set_ylim(0, 100)
    canvas.ax.set_ylabel("cached prompt tokens (%)")
    canvas.ax.set_xlabel(f"time since the run began ({unit}); one step per {_duration(width)}, by finish time")


def _prompt_vs_output(canvas: _Canvas, data: dict) -> None:
    grid = data["prompt_vs_output"]
    counts = np.asarray(grid["counts"], dtype=float)
    if not counts.sum():
        canvas.nothing("no samples yet")
        return
    from matplotlib.colors import LogNorm

    pw, ow = grid["prompt_width"], grid["output_width"]
    shown = np.where(counts > 0, counts, np.nan).T  # rows: output buckets, columns: prompt buckets
    image = canvas.ax.imshow(shown, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis",
                             norm=LogNorm(vmin=1, vmax=max(1.0, np.nanmax(shown))),
                             extent=(0, pw * counts.shape[0], 0, ow * counts.shape[1]))
    canvas.mark([image])
    canvas.fig.colorbar(image, ax=canvas.ax, label="samples", pad=0.01)
    budget = data["budget"]
    if budget and budget <= ow * counts.shape[1] * 1.05:
        line = canvas.ax.axhline(budget, color=PALETTE["budget"], linestyle="--", linewidth=1)
        canvas.mark([line])
    elif budget:
        canvas.ax.text(0.99, 0.98, f"max_new_tokens {budget:,} is above this range", ha="right", va="top",
                       color=PALETTE["budget"], fontsize=8, transform=canvas.ax.transAxes)
    canvas.ax.set_xlabel(f"prompt length (tokens; cells of {pw:,.0f})")
    canvas.ax.set_ylabel(f"output length (cells of {ow:,.0f})")


def _quality(canvas: _Canvas, data: dict) -> None:
    rows = data["samples"]["rows"]
    if not rows:
        canvas.nothing("no samples yet")
        return
    labels = {"empty_answer": "empty answer", "repeated": "output repeated across prompts",
              "no_stop_token": "no stop token at the end", "unclosed": "reasoning never closed",
              "truncated": "finish 'length' (truncated)"}
    shares = data["quality"]["shares"]
    counts = data["quality"]["counts"]
    y = np.arange(len(labels))
    values = np.array([100 * shares[k] for k in labels])
    colors = [PALETTE["dead"] if v else PALETTE["ok"] for v in values]
    canvas.ax.hlines(y, 0, values, color=colors, linewidth=3)
    dots = canvas.ax.scatter(values, y, color=colors, s=36, zorder=3)  # a dot at 0% is a good sign, drawn too
    canvas.mark([dots])
    caught = data["quality"]["dead_lettered"]
    for yi, key in zip(y, labels):
        note = f"{counts[key]:,} of {rows:,} stored" + (f"; {caught[key]:,} dead-lettered" if caught[key] else "")
        canvas.ax.annotate(note, (100 * shares[key], yi), xytext=(5, 0), textcoords="offset points", va="center",
                           fontsize=7)
    canvas.ax.set_yticks(y, list(labels.values()))
    canvas.ax.invert_yaxis()
    canvas.ax.set_xlim(-0.2, max(5.0, float(values.max()) * 1.3))
    canvas.ax.set_xlabel("share of stored samples (%); dead letters are not in the dataset")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:g} h"


CHARTS = (
    Chart("output_length", "Output length", "Healthy: one smooth hump well left of the budget line; a spike at "
          "the line is answers cut off by max_new_tokens.", _length("output", "output length")),
    Chart("reasoning_length", "Reasoning length (tokens before think-end)", "Healthy: a hump that ends well "
          "before the budget; reasoning that reaches the line never got to its answer.",
          _length("reasoning", "reasoning length")),
    Chart("answer_length", "Answer length (tokens after think-end)", "Healthy: answers of tens to a few "
          "thousand tokens; a bar at 0-1 is empty answers.", _length("answer", "answer length")),
    Chart("finish_reasons", "Finish reasons, every generation", "Healthy: nearly all 'stop'; more than a few "
          "percent 'length' means max_new_tokens is too small for this model.", _finish),
    Chart("think_closure", "Think closure", "Healthy: every stored sample closes its reasoning exactly once; "
          "'no think-end' goes with 'length' (cut off while reasoning).", _closure),
    Chart("quality", "Answers that look wrong, in the dataset", "Healthy: every dot at 0%; outputs repeated "
          "across prompts point at a broken sampler or a cache, missing stop tokens at truncation.", _quality),
    Chart("dead_letters_over_time", "Dead letters by reason over time", "Healthy: few, and spread over the run; "
          "a burst at one moment is a server or an outage, a steady stream is the rules or the budget.",
          _dead_over_time),
    Chart("throughput_over_time", "Samples and tokens per second", "Healthy: a quick ramp to a flat plateau "
          "until the queue drains; dips are outages, restarts or a producer holding back.", _throughput),
    Chart("server_throughput", "Throughput per server", "Healthy: servers of one kind give about the same "
          "tokens/s; one far below is slow, overloaded or often down.", _server_throughput),
    Chart("server_latency", "Latency per server", "Healthy: similar percentiles on every server; a long tail on "
          "one is a server that queues or retries.", _server_latency),
    Chart("cache_hits_per_server", "Prefix-cache hits per server", "Healthy: high where prompts share long "
          "prefixes (a system prompt, earlier turns), and alike on every server; one far below the rest is sent "
          "prefixes its cache does not hold, 0% everywhere is a radix cache turned off.", _cache_per_server),
    Chart("cache_hits_over_time", "Prefix-cache hits over time", "Healthy: rises in the first minutes as the "
          "caches fill, then stays flat; a drop is a server restarted (an empty cache) or evicting under memory "
          "pressure.", _cache_over_time),
    Chart("prompt_vs_output", "Prompt length against output length", "Healthy: a cloud below the budget line "
          "with no band along it; a band at the line is truncation.", _prompt_vs_output),
)
