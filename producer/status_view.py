"""The status report as tables for a terminal."""
from __future__ import annotations

import time
from typing import Callable

from contract.run.samples import per_prompt

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from contract.fleet.cache_hits import share_text

from contract.counts import counted
from .visible import cell, visible


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


def server_tables(workers: list[dict]) -> list[Table]:
    """The servers as each worker sees them, a table per worker: the worker and its model in
    the title, so URLs keep a column wide enough at 80 columns and are never folded mid-word."""
    if not workers:
        empty = Table(title="servers, as each worker sees them")
        empty.add_column("worker")
        empty.add_row("no live worker")
        return [empty]
    tables = []
    for worker in workers:
        models = {server.get("model_path") or "" for server in worker["servers"]}
        shared = models.pop() if len(models) == 1 else None
        title = f"servers, as {visible(worker['worker'])} sees them ({worker['seen_s_ago']:.0f}s ago"
        table = Table(title=Text(title + (f"; model {visible(shared)})" if shared else ")")))
        # servers of several models: each one's model on a line under its URL, in the same column
        table.add_column("server" if shared is not None else "server, model", no_wrap=True)
        for column in ("state", "in flight / target", "note"):
            table.add_column(column)
        for server in worker["servers"]:
            runs = "; ".join(f"refuses run {run}: {why}" for run, why in (server.get("refused_runs") or {}).items())
            note = server.get("refusal") or runs or server.get("last_error") or ""
            target = f" / {server['target']}" if server.get("target") else ""  # older workers: no target
            where = cell(server["url"])
            if shared is None:  # two lines, each shown as `cell` shows one
                where = cell(server["url"]).append("\n").append(cell(server.get("model_path") or "-"))
            table.add_row(where, cell(server["state"]), f"{server['in_flight']:,}{target}", cell(note))
        tables.append(table)
    return tables


def provenance_table(origins: list[dict]) -> Table:
    """What made the samples so far (contract/fleet/provenance.py): each server's URL with its model
    on the line under it, in one column, so neither is folded mid-word at 80 columns."""
    made = Table(title="samples made by", show_lines=True)
    made.add_column("server, model", no_wrap=True)
    made.add_column("SGLang")
    made.add_column("weight version", overflow="fold")
    for origin in origins:
        where = cell(origin["server"]).append("\n").append(cell(origin.get("model_path") or "-"))
        made.add_row(where, cell(origin.get("sglang_version") or "-"), cell(origin["weight_version"]))
    return made


def rate_window(seconds: float | None) -> str:
    """Which window the table's samples/s and tokens/s are of: the demo's figure is of its
    whole run and the report's of each server's busy span, so each says its own."""
    if not seconds:
        return "samples/s, tokens/s: output stored over the last minutes"
    span = f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:,.0f} s"
    return f"samples/s, tokens/s: output stored over the last {span}"


def _verification(figures: dict) -> Table:
    table = Table(title=f"verification ({escape(visible(figures['verifier']))}): stored samples by verdict")
    for column in ("passed", "failed", "error", "pass rate", "samples per verified"):
        table.add_column(column, justify="right")
    rate, spent = figures["pass_rate"], figures["samples_per_verified"]
    table.add_row(*(f"{figures[k]:,}" for k in ("passed", "failed", "error")),
                  "-" if rate is None else f"{rate:.1%}", "-" if spent is None else f"{spent:,.2f}")
    return table


def render_status(report: dict) -> Group:
    depth = report.get("queue_depth")
    shared = f", {counted(depth, 'message')} of every run on it" if depth is not None else ""
    counts = Table(title=f"run {report['run']!r} (queue {report['queue']}{shared})")
    several = report.get("samples_per_prompt", 1) > 1  # queued ... dead then count samples
    if several:
        counts.title += f"; {per_prompt(report['samples_per_prompt'], report.get('until_verified'))}, each counted"
    shown = ("prompts", *("samples",) * several, "queued", "in_flight", "done", "dead")
    for column in (*shown, "samples/s", "tokens/s", "ETA"):
        counts.add_column(column, justify="right")
    counts.add_row(*(f"{report[k]:,}" for k in shown),
                   f"{report['samples_per_s']:.2f}", f"{report['tokens_per_s']:,.0f}",
                   "done" if report["finished"] else _duration(report["eta_s"]))
    counts.caption = rate_window(report.get("rate_window_s"))
    parts = [counts]
    if "conversations" in report:
        talks = Table(title="conversations (each turn above is a prompt)")
        for column in ("enqueued", "complete", "stopped", "in_progress", "turns", "turns_done"):
            talks.add_column(column.replace("_", " "), justify="right")
        talks.add_row(*(f"{report['conversations'][k]:,}" for k in
                        ("enqueued", "complete", "stopped", "in_progress", "turns", "turns_done")))
        parts.append(talks)
    if "verification" in report:
        parts.append(_verification(report["verification"]))
    if report["dead_by_reason"]:
        dead = Table(title="dead letters by reason")
        dead.add_column("reason")
        dead.add_column("count", justify="right")
        for reason, count in report["dead_by_reason"].items():
            dead.add_row(cell(reason), f"{count:,}")
        parts.append(dead)
    origins = (report.get("provenance") or {}).get("servers") or []
    if origins:
        parts.append(provenance_table(origins))
    parts += server_tables(report["workers"])
    parts.append(_per_worker_table("storage (OUTPUT_DIR), as each worker sees it", "storage",
                                   report["workers"], storage_line))
    if report.get("cache_hits"):
        parts.append(_cache_table(report["cache_hits"]))
    parts.append(_per_worker_table("worker CPU (is one worker process the bottleneck?)", "cpu",
                                   report["workers"], cpu_line))
    return Group(*parts)


def storage_line(storage: dict) -> str:
    """`ok`, or `failing since 12:00:03 UTC (25s), last error: ...` (or `unknown`, from an older worker)."""
    if not storage:
        return "unknown"
    if storage.get("up", True):
        return "ok"
    since = storage.get("since") or 0.0
    age = storage.get("age_s", 0.0)  # on Redis's clock (`producer/status.py`), not this machine's
    return (f"failing since {time.strftime('%H:%M:%S', time.gmtime(since))} UTC ({_duration(age)}), "
            f"{storage.get('failures', 0)} failed writes, last error: {storage.get('last_error') or '?'}")


def _cache_table(hits: dict) -> Table:
    minutes = hits["window_s"] / 60
    table = Table(title=f"prefix-cache hits per server, last {minutes:g} min (all workers and runs)")
    for column in ("server", "prompt tokens", "cached tokens", f"hit share, {minutes:g} min"):
        table.add_column(column, justify="left" if column == "server" else "right", overflow="fold")
    for server in hits["servers"]:
        known = server["known_prompt_tokens"] > 0
        table.add_row(cell(server["server"]), f"{server['prompt_tokens']:,}",
                      f"{server['cached_tokens']:,}" if known else "-", share_text(server["share"]))
    if not hits["servers"]:
        table.add_row("no live worker", "", "", "")
    return table


def cpu_line(cpu: dict) -> str:
    """`62% of 1 core`, with the remedy while the worker is CPU-bound (`unknown` from an older worker)."""
    if not cpu or cpu.get("share") is None:
        return "unknown"
    cores = cpu.get("cores") or 1
    line = f"{100 * cpu['share']:.0f}% of {cores:g} {'core' if cores == 1 else 'cores'}"
    if cpu.get("slots"):
        line += f"; servers {cpu['free_slots']:,} of {counted(cpu['slots'], 'slot')} free"
    if cpu.get("bound"):
        line = f"CPU-BOUND: {line}; {cpu.get('remedy') or 'start another worker process on this node'}"
    return line


def _per_worker_table(title: str, column: str, workers: list[dict], line: Callable[[dict], str]) -> Table:
    """One row per live worker: `line` of the part of its heartbeat named `column`."""
    table = Table(title=title)
    table.add_column("worker")
    table.add_column(column, overflow="fold")
    for worker in workers:
        table.add_row(cell(worker["worker"]), cell(line(worker.get(column) or {})))
    if not workers:
        table.add_row("no live worker", "")
    return table
