"""What the demo prints: its result, its dead letters as a table, and what to try next.

Every command it prints works as printed, from any folder: with the absolute path of the
interpreter it ran with, and the `REDIS_URL` of the Redis it kept (`demo_redis.py`). The shards need no
`OUTPUT_DIR`: the run records where its workers wrote them
(`contract/storage/shard_home.py`). Text from prompts and dead letters is shown with
its control characters visible (`visible.py`).
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contract.counts import counted
from .visible import cell

RUN = "demo"


def interpreter() -> str:
    """This Python by its absolute path: a command printed with it runs as printed from any
    folder (`.venv/bin/python` would run only from the repository's root)."""
    return sys.executable


def command_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """`[VAR=value ...] python ARGV` as one shell line."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + " ".join(shlex.quote(a) for a in [interpreter(), *argv])


def print_result(report: dict, output_dir: str, workdir: Path, seconds: float, console: Console) -> None:
    folder = Path(output_dir, RUN).resolve()
    shards = sorted(folder.glob("*.parquet"))
    table = Table(title="result", show_header=False)
    table.add_column("what")
    table.add_column("figure", justify="right")
    table.add_row("samples stored", f"{report['done']:,}")
    table.add_row("dead letters", f"{report['dead']:,}")
    for reason, count in report["dead_by_reason"].items():
        table.add_row(f"  {reason}", f"{count:,}")
    table.add_row("still pending", f"{report['pending']:,}")
    table.add_row("output tokens", f"{report['output_tokens']:,}")
    table.add_row("tokens/s (output, enqueue to last prompt settled)", f"{report['output_tokens'] / seconds:,.0f}")
    console.print(table)
    say = _plain(console)
    say(f"shards: {counted(len(shards), 'file')} in {folder}")
    for path in shards:
        say(f"  {path}")
    say(f"export: {workdir / 'export'}")
    if report["dead"]:
        letters = Table(title=f"dead letters, each with its reason (the first {len(report['examples'])})")
        for column in ("id", "reason", "message"):
            letters.add_column(column, overflow="fold")
        for letter in report.get("examples", []):
            letters.add_row(cell(letter["id"]), cell(letter["reason"]), cell(letter["message"]))
        console.print(letters)


def print_next_steps(report: dict, talks: dict | None, env: dict[str, str], kept: dict | None, workdir: Path,
                     seconds: float, console: Console) -> None:
    """The short summary, and commands to try next, each runnable as printed."""
    say = _plain(console)
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in report["dead_by_reason"].items())
    say("")
    say(f"summary: {counted(report['done'], 'sample')} stored, {counted(report['dead'], 'dead letter')}"
        + (f" ({reasons})" if reasons else "") + f", {report['pending']:,} pending; took {seconds:,.0f} s")
    if talks:
        say(f"conversations: {talks.get('complete', 0):,} of {talks.get('enqueued', 0):,} complete, exported to "
            f"{workdir / 'export-chat'}")
    needs = {"REDIS_URL": kept["url"]} if kept else {}
    example = (report.get("examples") or [{}])[0].get("id")
    steps = [("where the run stands", ["status", "--run", RUN]),
             ("every run in this Redis", ["runs"]),
             ("its dead letters, with reasons", ["dead", "list", "--run", RUN])]
    if example:
        steps.append(("one dead letter, decoded", ["show", example, "--run", RUN]))
    steps.append(("export the dataset again", ["export", str(workdir / "export"), "--run", RUN]))
    say("try next:")
    for what, args in steps:
        say(f"  # {what}")
        say(f"  {command_line(['-m', 'producer', *args], needs)}")
    say(f"  # the report page: {workdir / 'report.html'}")
    if kept:
        say(f"the demo's Redis keeps running (append-only, its data in {kept['dir']}); stop it with: "
            f"kill {kept['pid']}")


def _plain(console: Console):
    """Print one line as is: no markup, no highlighting, never cut at the terminal's width."""
    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    return say
