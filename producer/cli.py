"""`python -m producer`: enqueue prompts, watch a run, handle dead letters, export.

The entry point: each command builds the settings once (flags over the
environment) and passes them on; importing this module reads nothing.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn)
from rich.table import Table

from .prompts import MAX_LINE_BYTES

# Locals stay out of tracebacks: they would print REDIS_URL and its password.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_show_locals=False)
dead_app = typer.Typer(no_args_is_help=True, help="Inspect, replay and purge dead-lettered prompts.")
app.add_typer(dead_app, name="dead")
out = Console()
err = Console(stderr=True, soft_wrap=True)  # messages stay one line each, whatever the width

RunOpt = typer.Option(None, "--run", envvar="FLEET_RUN", help="Run name (default: 'default').")
RedisOpt = typer.Option(None, "--redis-url", help="Overrides REDIS_URL.")


def _connect(redis_url: str | None):
    """The shared settings (a --redis-url flag over REDIS_URL), and a Redis client, once
    one quick PING has shown that Redis answers (else exit 2 with the URL redacted)."""
    from contract.connections import redis_for
    from contract.settings import SharedSettings

    settings = SharedSettings(**({"redis_url": redis_url} if redis_url else {}))
    _probe_redis(settings.redis_url)
    return settings, redis_for(settings.redis_url)


def _probe_redis(url: str) -> None:
    """One PING without retries: a wrong host or password is said at once, in words that
    hold no secret, instead of a traceback after the shared client's minutes of retries."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from contract.connections import client_for, redact_text, redact_url

    try:
        probe = client_for(url, retry=Retry(NoBackoff(), 0), max_connections=1)
        try:
            probe.ping()
        finally:
            probe.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        err.print(f"[red]cannot use Redis at {escape(redact_url(url))}[/red]: "
                  f"{exc.__class__.__name__}: {escape(redact_text(str(exc), url))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def _publisher(settings):
    """A Celery app that only publishes (the worker's app is never built here)."""
    from contract.broker import celery_app

    return celery_app(settings.redis_url, queue=settings.queue_prefix)


def _run_name(run: str | None) -> str:
    """The checked run name (None: 'default'); a bad one exits 2 before anything is written."""
    from contract.spec import BadRunName, check_run_name

    try:
        return check_run_name("default" if run is None else run)
    except BadRunName as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2)


def _spec(client, run: str | None):
    """The run's spec, or exit 2 saying why not (no such run, or one of an older layout)."""
    from contract.spec import OlderLayout, load_spec

    name = _run_name(run)
    try:
        spec = load_spec(client, name)
    except OlderLayout as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2)
    if spec is None:
        err.print(f"[red]no run named {name!r} in Redis[/red] (enqueue one first, or pass --run)")
        raise typer.Exit(2)
    return spec


@app.command()
def enqueue(
    prompts: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSONL prompt file."),
    tokenizer: str = typer.Option("bundled", help="Tokenizer path or hub id ('bundled': DeepSeek-R1 style)."),
    served_model: Optional[str] = typer.Option(None, help="Only servers whose /model_info names this model get the run."),
    max_new_tokens: int = typer.Option(8192, min=1),
    temperature: float = typer.Option(0.6, min=0.0),
    top_p: float = typer.Option(0.95, min=0.0, max=1.0),
    trust_remote_code: bool = typer.Option(False, help="Needed by tokenizers such as Kimi-K2.5's."),
    thinking: str = typer.Option("auto", help="auto | prompt (template appends think-start) | output (model emits it) | off."),
    think_start: str = typer.Option("<think>", help="Think-start token text."),
    think_end: str = typer.Option("</think>", help="Think-end token text."),
    disable_rule: list[str] = typer.Option([], help="Verification rule codes to switch off."),
    max_prompt_tokens: Optional[int] = typer.Option(None, help="Reject longer prompts here."),
    turns: str = typer.Option("last", help="last: one generation per prompt (its whole conversation is the "
                              "prompt) | all: regenerate every assistant turn of each conversation, in order."),
    max_queued: int = typer.Option(100_000, min=0, help="Hold back while the queue is deeper than this (0: never)."),
    max_line_bytes: int = typer.Option(MAX_LINE_BYTES, min=1, help="A longer line is reported and skipped "
                                       "(default 16 MiB), never held in memory."),
    run: Optional[str] = RunOpt,
    redis_url: Optional[str] = RedisOpt,
) -> None:
    """Tokenize each prompt with the chat template and publish one task per prompt.

    A content may be a string or OpenAI's list of text parts (joined with a
    space, as SGLang does). A malformed line (bad UTF-8 or JSON, JSON nested too
    deeply, a number, boolean or null where text belongs, a NUL character, a
    lone surrogate, a line over --max-line-bytes, a content part other than
    text) or a prompt the chat template refuses is reported with its line number
    and reason and skipped; the others are published, and the exit status is 1.
    """
    name = _run_name(run)
    settings, client = _connect(redis_url)
    from contract.names import VERIFY_RULES

    from contract.chat import ChatTokenizer
    from contract.replication import FailedOver
    from .enqueue import RunMismatch, enqueue_file, new_spec, prepare_run

    if turns not in ("last", "all"):
        err.print(f"[red]--turns must be 'last' or 'all', not {turns!r}[/red]")
        raise typer.Exit(2)
    unknown = set(disable_rule) - {str(r) for r in VERIFY_RULES}
    if unknown:
        err.print(f"[red]unknown rule(s) {sorted(unknown)}[/red]; known: {', '.join(map(str, VERIFY_RULES))}")
        raise typer.Exit(2)
    chat = ChatTokenizer(tokenizer, trust_remote_code, think_start, think_end)
    spec = new_spec(chat, name, tokenizer, max_new_tokens, temperature, top_p, thinking,
                    served_model, disable_rule, turns, trust_remote_code)
    from contract.spec import OlderLayout

    try:
        spec = prepare_run(client, spec)
    except (RunMismatch, OlderLayout) as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2)
    celery_app = _publisher(settings)

    size = prompts.stat().st_size
    with Progress(TextColumn("enqueue"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("read", total=size)
        try:
            summary = enqueue_file(prompts, spec, chat, client, celery_app, settings.queue_prefix,
                                   max_prompt_tokens, on_progress=lambda pos: bar.update(task, completed=pos),
                                   max_queue_depth=max_queued, max_line_bytes=max_line_bytes)
        except FailedOver as exc:
            err.print(f"[red]{escape(str(exc))}[/red]: run the same enqueue again; it publishes only "
                      "what the new primary lacks")
            raise typer.Exit(3)
    _print_enqueue_summary(summary, spec.thinking)
    if summary.rejected:
        raise typer.Exit(1)


def _print_enqueue_summary(summary, mode: str) -> None:
    def say(text: str) -> None:  # the file's own text, printed as is: one line, no markup
        err.print(_printable(text), markup=False, highlight=False, soft_wrap=True)

    for item in summary.rejected[:50]:
        say(f"line {item.line}: {item.reason}" + (f" (id {item.id})" if item.id else ""))
    if summary.rejected_count > 50:
        say(f"... and {summary.rejected_count - 50} more rejected lines")
    for item in summary.duplicates[:20]:
        say(f"line {item.line}: {item.reason}: {item.id}")
    if summary.duplicate_count > 20:
        say(f"... and {summary.duplicate_count - 20} more duplicate lines")
    table = Table(title=f"enqueue: run {summary.run!r} -> queue {summary.queue!r} (thinking: {mode})")
    for column in ("published", "prompt tokens", "skipped (already in run)", "duplicates", "rejected", "prompts/s"):
        table.add_column(column, justify="right")
    rate = summary.published / summary.seconds if summary.seconds else 0.0
    already = ", ".join(f"{k}={v}" for k, v in sorted(summary.already.items())) or "0"
    table.add_row(str(summary.published), str(summary.prompt_tokens), already,
                  str(summary.duplicate_count), str(summary.rejected_count), f"{rate:,.0f}")
    out.print(table)
    if summary.held_back:
        out.print(f"held back {summary.held_back:.0f}s while the queue was deeper than --max-queued")


def _printable(text: str) -> str:
    """Control characters (a terminal escape sequence in an id, say) shown escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@app.command()
def status(run: Optional[str] = RunOpt, as_json: bool = typer.Option(False, "--json"),
           watch: Optional[float] = typer.Option(None, "--watch", help="Refresh every N seconds."),
           redis_url: Optional[str] = RedisOpt) -> None:
    """Queued, in flight, done, dead by reason, rates, ETA, servers and workers."""
    name = _run_name(run)
    settings, client = _connect(redis_url)
    from rich.live import Live

    from .status import collect_status
    from .status_view import render_status

    spec = _spec(client, name)
    if as_json:
        sys.stdout.write(json.dumps(collect_status(client, spec, settings.queue_prefix)) + "\n")
        return
    if not watch:
        out.print(render_status(collect_status(client, spec, settings.queue_prefix)))
        return
    with Live(console=out, auto_refresh=False) as live:
        while True:
            live.update(render_status(collect_status(client, spec, settings.queue_prefix)), refresh=True)
            time.sleep(watch)


@dead_app.command("list")
def dead_list(run: Optional[str] = RunOpt, reason: list[str] = typer.Option([], help="Only these reason codes."),
              limit: int = typer.Option(0, min=0, help="At most this many (0: all)."),
              as_json: bool = typer.Option(False, "--json"), redis_url: Optional[str] = RedisOpt) -> None:
    """Dead-lettered prompts with their reasons, streamed as they are read (`--json`: a JSON
    array), in the store's order; `dead stats` counts them."""
    name = _run_name(run)
    _, client = _connect(redis_url)
    import itertools

    from contract.deadletters import DeadLetters

    store = DeadLetters(client, _spec(client, name).name)
    letters = store.scan(reason or None)
    if limit:
        letters = itertools.islice(letters, limit)
    if as_json:
        _stream_json(d.summary() for d in letters)
        return
    shown = 0
    for page in _pages(letters, 500):
        table = Table(title=None if shown else f"dead letters of run {name!r}", show_header=not shown)
        for column in ("id", "reason", "attempts", "message"):
            table.add_column(column, overflow="fold")
        for d in page:
            table.add_row(escape(d.id), d.reason, str(d.attempts), escape(d.message))
        out.print(table)
        shown += len(page)
    total = store.count(reason or None)
    out.print(f"{shown} dead letters shown" + (f" of {total}" if total != shown else ""))


def _stream_json(items) -> None:
    """A JSON array written an element at a time."""
    sys.stdout.write("[")
    for n, item in enumerate(items):
        sys.stdout.write(("," if n else "") + json.dumps(item, ensure_ascii=False))
    sys.stdout.write("]\n")


def _pages(items, size: int):
    import itertools

    iterator = iter(items)
    while page := list(itertools.islice(iterator, size)):
        yield page


@dead_app.command("show")
def dead_show(prompt_id: str, run: Optional[str] = RunOpt, redis_url: Optional[str] = RedisOpt) -> None:
    """One dead letter in full, with its prompt's token ids."""
    name = _run_name(run)
    _, client = _connect(redis_url)
    from contract.codec import b64_to_ids
    from contract.deadletters import DeadLetters

    letter = DeadLetters(client, _spec(client, name).name).get(prompt_id)
    if letter is None:
        err.print(f"[red]no dead letter for id {escape(repr(prompt_id))}[/red]")
        raise typer.Exit(1)
    data = letter.summary() | {"prompt_ids": b64_to_ids(letter.prompt_b64)}
    out.print_json(json.dumps(data, ensure_ascii=False))


@dead_app.command("stats")
def dead_stats(run: Optional[str] = RunOpt, as_json: bool = typer.Option(False, "--json"),
               redis_url: Optional[str] = RedisOpt) -> None:
    """Dead letters counted by reason."""
    name = _run_name(run)
    _, client = _connect(redis_url)
    from contract.deadletters import DeadLetters

    stats = DeadLetters(client, _spec(client, name).name).stats()
    if as_json:
        sys.stdout.write(json.dumps(stats) + "\n")
        return
    for reason, count in stats.items():
        out.print(f"{reason:28} {count}")
    out.print(f"{'total':28} {sum(stats.values())}")


@dead_app.command("requeue")
def dead_requeue(run: Optional[str] = RunOpt, reason: list[str] = typer.Option([]),
                 prompt_id: list[str] = typer.Option([], "--id"),
                 max_new_tokens: Optional[int] = typer.Option(None, min=1, help="A larger budget, e.g. for truncated prompts."),
                 yes: bool = typer.Option(False, "--yes", "-y"), redis_url: Optional[str] = RedisOpt) -> None:
    """Publish dead-lettered prompts again (all, or by --reason / --id), a page at a time as
    the letters are read."""
    name = _run_name(run)
    settings, client = _connect(redis_url)
    from contract.deadletters import DeadLetters

    from .dead import replayable, requeue

    spec = _spec(client, name)
    store = DeadLetters(client, spec.name)
    pages = [store.select(reason or None, prompt_id)] if prompt_id else store.pages(reason or None)
    total = sum(len(p) for p in pages) if prompt_id else store.count(reason or None)
    if not total:
        out.print("nothing to requeue")
        return
    if not yes:
        typer.confirm(f"requeue {total} dead letters of run {spec.name!r}?", abort=True)
    count, seen, idless, publisher = 0, 0, 0, _publisher(settings)
    with Progress(TextColumn("requeue"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("requeue", total=total)
        for page in pages:
            idless += sum(not replayable(d) for d in page)
            count += requeue(client, publisher, spec, page, settings.queue_prefix, max_new_tokens)
            seen += len(page)
            bar.update(task, completed=seen)
    out.print(f"requeued {count} prompts" + (f" with max_new_tokens={max_new_tokens}" if max_new_tokens else ""))
    if idless:
        err.print(f"kept {idless} dead letters that hold no token ids (Redis had lost their prompts; "
                  "see `dead list --reason worker_error`): enqueue their lines again under a new run")


@dead_app.command("purge")
def dead_purge(run: Optional[str] = RunOpt, reason: list[str] = typer.Option([]),
               yes: bool = typer.Option(False, "--yes", "-y"), redis_url: Optional[str] = RedisOpt) -> None:
    """Delete dead letters (all, or by --reason), a page at a time. Their prompts stay marked dead."""
    name = _run_name(run)
    _, client = _connect(redis_url)
    from contract.deadletters import DeadLetters

    store = DeadLetters(client, _spec(client, name).name)
    total = store.count(reason or None)
    if not total:
        out.print("nothing to purge")
        return
    if not yes:
        typer.confirm(f"delete {total} dead letters?", abort=True)
    purged = sum(store.remove([d.id for d in page]) for page in store.pages(reason or None))
    out.print(f"purged {purged} dead letters")


@app.command()
def export(dest: str = typer.Argument(..., help="A new or empty folder, or a previous export to replace; or "
                                      "s3://bucket/prefix (read it through its manifest.json)."),
           run: Optional[str] = RunOpt, rows_per_file: int = typer.Option(10_000, min=1),
           jobs: int = typer.Option(0, min=0, help="Processes sharing the shards (0: one per GiB of shards, "
                                    "at most one per core and 8)."),
           index_only: bool = typer.Option(False, "--index-only", help="Write keep-*.parquet, the (shard, id) "
                                           "of each canonical row, instead of copying the rows."),
           format: str = typer.Option("parquet", "--format", help="parquet (the rows as stored), specforge or "
                                      "speculators (JSONL of input_ids and loss_mask), text (decoded messages)."),
           prompts: list[Path] = typer.Option([], "--prompts", help="text: the input file(s), for the system and "
                                              "user messages before each answer."),
           trust_remote_code: bool = typer.Option(False, help="text: needed to load tokenizers such as Kimi-K2.5's."),
           complete_only: bool = typer.Option(False, "--complete-only", help="A run of conversations "
                                              "(--turns all): only the turns of conversations whose every "
                                              "turn is stored."),
           redis_url: Optional[str] = RedisOpt) -> None:
    """Write the finished dataset (each done id once) and a manifest to DEST.

    Exporting again into the same DEST replaces the previous export in one step:
    the new one is written into a folder beside DEST and swapped in, so a reader
    of DEST/*.parquet sees the old export or the new one, never both. A DEST that
    holds anything else is refused (exit 2) and left alone. Samples whose prompt
    the ledger does not mark done (dead-lettered since, or queued again) are left
    out and counted in the manifest. --index-only copies nothing: readers of the
    shards in place (DuckDB, Spark) semi-join them with DEST/keep-*.parquet.
    --format writes the same rows for a trainer (docs/data/exports.md).
    """
    from .formats import NAMES, FormatRefused

    if format not in NAMES or (index_only and format != "parquet"):
        err.print(f"[red]--format is one of {', '.join(NAMES)}, and only parquet goes with --index-only[/red]")
        raise typer.Exit(2)
    name = _run_name(run)
    settings, client = _connect(redis_url)
    from contract.storage import UnsupportedOutput, store_for

    from .export import export_run
    from .export_bucket import is_bucket
    from .export_folder import ExportRefused, check_replaceable

    spec = _spec(client, name)
    if complete_only and spec.turns != "all":
        err.print(f"[red]--complete-only is for a run of conversations (enqueue --turns all); run {name!r} "
                  f"has one generation per prompt[/red]")
        raise typer.Exit(2)
    try:
        if not is_bucket(dest):  # raises UnsupportedOutput (gs://...)
            check_replaceable(Path(dest).resolve())
        total = len(store_for(settings.output_dir).shards(spec.name))
        with Progress(TextColumn("export"), BarColumn(), TextColumn("{task.completed}/{task.total} shards"),
                      console=err, transient=True) as bar:
            task = bar.add_task("export", total=total)
            manifest = export_run(spec, client, settings.output_dir, dest, rows_per_file,
                                  on_progress=lambda n: bar.update(task, completed=n),
                                  jobs=jobs, redis_url=settings.redis_url, index_only=index_only, format=format,
                                  format_options={"prompts": prompts, "trust_remote_code": trust_remote_code},
                                  complete_only=complete_only)
    except (ExportRefused, FormatRefused, UnsupportedOutput) as exc:
        err.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2)
    left_out = ", ".join(f"{k}={v}" for k, v in manifest["left_out"].items()) or "none"
    what = "indexed" if index_only else "exported"
    out.print(f"{what} {manifest['rows']} samples ({manifest['duplicates_dropped']} duplicates dropped, "
              f"left out as not done: {left_out}) into {len(manifest['files'])} files under {dest}; "
              f"dead letters: {manifest['dead_letters']}")
    if "format" in manifest:
        figures = manifest["format"]
        out.print(f"format {figures['name']}: {figures['rows']} rows, {figures['prompt_tokens']} prompt tokens "
                  f"(loss mask 0), {figures['generated_tokens']} generated tokens (loss mask 1), longest row "
                  f"{figures['max_row_tokens']} tokens")


@app.command()
def demo(prompts: Optional[Path] = typer.Option(None, help="Default: the bundled examples."),
         workdir: Path = typer.Option(Path("demo-run"), help="Logs, shards and export go here.")) -> None:
    """Run the whole job on this machine with embedded defaults, and show the result."""
    from .demo import run_demo

    raise typer.Exit(run_demo(prompts, workdir, out))


@app.command()
def report(run: Optional[str] = RunOpt,
           out_path: Path = typer.Option(Path("report.html"), "--out", help="Where to write the page."),
           trust_remote_code: bool = typer.Option(False, help="Needed to load tokenizers such as Kimi-K2.5's."),
           redis_url: Optional[str] = RedisOpt) -> None:
    """One self-contained HTML page about a run: lengths, finishes, dead letters, speed, servers, examples."""
    settings, client = _connect(redis_url)
    from .report import build_report

    spec = _spec(client, run)
    data = build_report(client, spec, settings.output_dir, settings.queue_prefix, out_path, trust_remote_code)
    out.print(f"report of run {spec.name!r} ({data['samples']['unique_ids']} samples, "
              f"{data['dead_letters']['total']} dead letters): {out_path.resolve()}")


@app.command()
def show(prompt_id: str = typer.Argument(..., metavar="ID"), run: Optional[str] = RunOpt,
         ids: bool = typer.Option(False, "--ids", help="Also list every token: position, id, text."),
         trust_remote_code: bool = typer.Option(False, help="Needed to load tokenizers such as Kimi-K2.5's."),
         redis_url: Optional[str] = RedisOpt) -> None:
    """One stored sample (or dead letter) decoded: prompt, reasoning, answer, special tokens, provenance."""
    settings, client = _connect(redis_url)
    from contract.deadletters import DeadLetters

    from .show import find_samples, letter_view, load_decoder, render_text, sample_view

    spec = _spec(client, run)
    rows = find_samples(settings.output_dir, spec.name, [prompt_id]).get(prompt_id)
    letter = None if rows else DeadLetters(client, spec.name).get(prompt_id)
    if not rows and letter is None:
        err.print(f"[red]no sample or dead letter with id {prompt_id!r} in run {spec.name!r}[/red]")
        raise typer.Exit(1)
    shown = sample_view(rows, spec) if rows else letter_view(letter, spec)
    sys.stdout.write(render_text(shown, load_decoder(spec, trust_remote_code), with_ids=ids))


def main() -> None:
    """Run a command; Redis refusing writes (out of memory, read-only, no replicas) ends it with
    one line and exit status 3, never a traceback. What a command wrote before is safe: `enqueue`
    records each prompt before publishing it, so a re-run publishes only what is missing."""
    from pydantic import ValidationError

    from contract.settings import settings_refusal
    from contract.write_refusal import refusal

    try:
        app()
    except ValidationError as exc:  # OUTPUT_DIR=gs://... and the like: one line, no traceback
        err.print(f"[red]{escape(settings_refusal(exc))}[/red]", highlight=False)
        sys.exit(2)
    except Exception as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        err.print(f"[red]{escape(refused.line())}[/red]; then run the command again", highlight=False)
        sys.exit(3)
