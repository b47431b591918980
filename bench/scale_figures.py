"""The scale part's figures: each cost at each size, and the goals the issue sets.

Judged: Redis bytes per finished prompt at 10^6 prompts or more (<= 24 B); status
and dead stats sending the same commands at the largest size as at the smallest,
and their latency flat (largest / smallest <= 2: medians of ~1 ms on a shared
machine); producer and export peak RSS flat (largest / smallest <= 1.10 and
<= 1.25: the export's Arrow pool holds one shard's batches); export with its
default jobs within 2x of `pyarrow.dataset` reading the same shards, at the
largest size; the real run's per-prompt costs, last tenth over first, <= 1.25
for runs of 10^4 prompts or more (CPU is read in 10 ms ticks: smaller runs are
informational).
"""
from __future__ import annotations

from .report import Figure, at_most

MiB = 1024 * 1024
PART = "6 scale"


def scale_figures(d: dict) -> list[Figure]:
    results = {int(n): r for n, r in d["results"].items()}
    sizes = sorted(results)
    small, large = results[sizes[0]], results[sizes[-1]]
    figures = []
    for n in sizes:
        r = results[n]
        judged = n >= 1_000_000
        figures.append(Figure(PART, f"Redis bytes per finished prompt @ {n:,}", r["bytes_per_finished"], "{:.1f}",
                              "B", goal="<= 24" if judged else "", met=at_most(r["bytes_per_finished"], 24)
                              if judged else None,
                              note=f"{r['state_buckets']:,} state buckets, "
                                   f"{', '.join(f'{k} {v}' for k, v in r['bucket_encodings_sampled'].items())} "
                                   f"(sampled); filled in {r['fill_s']:.0f} s"))
    for name in ("status", "dead_stats"):
        shown = name.replace("_", " ")
        for n in sizes:
            figures.append(Figure(PART, f"{shown} latency @ {n:,}", results[n][f"{name}_ms"], "{:.2f}", "ms",
                                  note=f"median of in-process calls; commands per call: "
                                       f"{_commands(results[n][f'{name}_commands'])}"))
        if len(sizes) > 1:
            ratio = large[f"{name}_ms"] / small[f"{name}_ms"]
            same = large[f"{name}_commands"] == small[f"{name}_commands"]
            figures.append(Figure(PART, f"{shown} latency {sizes[-1]:,} / {sizes[0]:,}", ratio, "{:.2f}",
                                  goal="<= 2 (flat), same commands", met=ratio <= 2 and same,
                                  note="same Redis commands at both sizes" if same else "commands differ!"))
    figures += _memory_figures(results, sizes)
    if "export" in large:
        figures += _export_figures(results, sizes)
    return figures


def _commands(commands: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in commands.items())


def _memory_figures(results: dict, sizes: list[int]) -> list[Figure]:
    figures = []
    for key, name, goal in (("producer", "producer peak RSS", 1.10), ("export", "export peak RSS (1 job)", 1.25)):
        have = [n for n in sizes if key in results[n]]
        if not have:
            continue
        rss = {n: _rss(results[n], key) for n in have}
        for n in have:
            extra = results[n][key]
            note = (f"python -m producer enqueue, {extra['prompts_per_s']:,.0f} prompts/s" if key == "producer"
                    else f"python -m producer export --jobs 1, {extra['one_job']['rows_per_s']:,.0f} rows/s")
            figures.append(Figure(PART, f"{name} @ {n:,}", rss[n] / MiB, "{:.0f}", "MiB", note=note))
        if len(have) > 1:
            ratio = rss[have[-1]] / rss[have[0]]
            figures.append(Figure(PART, f"{name} {have[-1]:,} / {have[0]:,}", ratio, "{:.3f}",
                                  goal=f"<= {goal} (flat)", met=at_most(ratio, goal)))
    return figures


def _rss(result: dict, key: str) -> int:
    return result[key]["peak_rss_bytes"] if key == "producer" else result[key]["one_job"]["peak_rss_bytes"]


def _export_figures(results: dict, sizes: list[int]) -> list[Figure]:
    figures = []
    for n in sizes:
        e = results[n].get("export")
        if not e:
            continue
        judged = n == sizes[-1]
        read = e["pyarrow_dataset"]
        default = e["default_jobs"]
        m = default["manifest"]
        figures.append(Figure(
            PART, f"export / pyarrow.dataset read, wall @ {n:,}", default["over_read"], "{:.2f}",
            goal="<= 2" if judged else "", met=at_most(default["over_read"], 2.0) if judged else None,
            note=f"{e['source_rows']:,} rows, {e['source_bytes'] / MiB:,.0f} MiB in {e['shards']:,} shards: read "
                 f"{read['wall_s']:.1f} s, export {default['wall_s']:.1f} s ({m['shards_whole']} shards whole, "
                 f"{m['shards_rewritten']} rewritten, {m['duplicates_dropped']:,} duplicates dropped); "
                 f"{e['cores']} jobs: {e['all_cores']['over_read']:.2f}x"))
        if "all_cores_every_row" in e:
            worst = e["all_cores_every_row"]
            figures.append(Figure(
                PART, f"export, every row looked up and rewritten @ {n:,}", worst["over_read"], "{:.2f}", "x read",
                note=f"worst case (--rows-per-file below the shards' size, {worst['jobs']} jobs): "
                     f"{worst['rows_per_s']:,.0f} rows/s, peak RSS {worst['peak_rss_bytes'] / MiB:.0f} MiB"))
    return figures


def real_run_figures(d: dict) -> list[Figure]:
    n = d["prompts"]
    judged = n >= 10_000
    part = f"6 scale, real run of {n:,}"
    figures = [Figure(part, "Redis bytes per finished prompt", d["bytes_per_finished"], "{:.1f}", "B",
                      note="INFO used_memory after the run over before it, per prompt (queue drained)")]
    for phase, label in (("enqueue", "enqueue"), ("drain", "worker")):
        first, last = d[phase]["first"], d[phase]["last"]
        for key, ratio in d[phase]["ratio"].items():
            goal = judged and (key == "s_per_prompt" or key.startswith(("producer_cpu", "worker_cpu")))
            scale = 1000 if key == "s_per_prompt" else 1  # shown in ms, as the others
            figures.append(Figure(
                part, f"{label}: {key.replace('_', ' ')}, last / first tenth", ratio, "{:.2f}",
                goal="<= 1.25" if goal else "", met=at_most(ratio, 1.25) if goal else None,
                note=f"{first[key] * scale:.3f} ms -> {last[key] * scale:.3f} ms"))
    return figures
