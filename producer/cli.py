"""`python -m producer`: enqueue prompts, watch a run, handle dead letters, export.

The entry point; the steps every command shares are in `cli_common.py`, the
dead-letter commands in `cli_dead.py`.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from contract.chat.conversations import ALL, LAST
from contract.run.logprobs import MAX_LOGPROBS
from contract.names import VERIFY_RULES, Thinking

from .cli_common import (check_has_prompts, choice, connect, err, fail, json_option, ledger_key, load_run, out,
                         print_shown, no_prompts, publisher, reading, redis_option, run_name, run_option,
                         sample_option, shards_of)
from .cli_dead import dead_app
from .cli_help import Command
from contract.counts import counted
from .prompts import MAX_LINE_BYTES
from .visible import visible

HELP = """Enqueue prompts, watch a run, handle its dead letters, export its dataset.

Every command reads REDIS_URL (default redis://localhost:6379/0). Commands that
read shards (export, report, show) read them where the run's workers wrote them,
unless OUTPUT_DIR is set.
"""

# Locals stay out of tracebacks: they would print REDIS_URL and its password. Help is plain
# text (click's), which wraps at any width and never cuts an option's name.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP, pretty_exceptions_show_locals=False,
                  rich_markup_mode=None)
app.add_typer(dead_app, name="dead")


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        out.print(f"reasoning-fleet {version('reasoning-fleet')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


@app.command(cls=Command, short_help="Tokenize prompts (JSONL, Parquet or a datasets folder) and queue them.")
def enqueue(
    prompts: Path = typer.Argument(..., exists=True, metavar="PROMPTS",
                                   help="JSONL file, Parquet file (.parquet), or a folder saved by datasets' "
                                        "save_to_disk."),
    tokenizer: Optional[str] = typer.Option(None, metavar="NAME",
                                            help="Tokenizer folder or hub id (org/name); left out or 'bundled': "
                                                 "the bundled DeepSeek one (R1-style template), said in the summary."),
    served_model: Optional[str] = typer.Option(None, metavar="MODEL",
                                               help="Only servers whose /model_info names this model get the run."),
    max_new_tokens: int = typer.Option(8192, min=1, metavar="N", help="The generation budget of each prompt."),
    temperature: float = typer.Option(0.6, min=0.0, metavar="VALUE", help="Sampling temperature."),
    top_p: float = typer.Option(0.95, min=0.0, max=1.0, metavar="VALUE", help="Nucleus sampling's top-p."),
    logprobs: int = typer.Option(0, min=0, max=MAX_LOGPROBS, metavar="K",
                                 help=f"Store the top-K log-probabilities of each output token (1-{MAX_LOGPROBS}; "
                                      "0: none), for distillation."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Needed by tokenizers such as Kimi-K2.5's."),
    thinking: str = choice("auto", "--thinking", values=("auto", *map(str, Thinking)), metavar="MODE",
                           help="prompt: the template appends think-start; output: the model emits it; off: "
                                "not a reasoning model; auto: detect."),
    think_start: str = typer.Option("<think>", metavar="TEXT", help="Think-start token text."),
    think_end: str = typer.Option("</think>", metavar="TEXT", help="Think-end token text."),
    disable_rule: list[str] = choice([], "--disable-rule", values=tuple(map(str, VERIFY_RULES)), metavar="RULE",
                                     help="A verification rule to switch off (repeatable)."),
    max_prompt_tokens: Optional[int] = typer.Option(None, min=1, metavar="N", help="Reject longer prompts here."),
    turns: str = choice(LAST, "--turns", values=(LAST, ALL), metavar="TURNS",
                        help="last: one generation per prompt (its whole conversation is the prompt); all: "
                             "regenerate every assistant turn of each conversation, in order."),
    samples: int = typer.Option(1, min=1, metavar="N", help="Samples of each prompt, each its own request with its "
                                "own sampling_seed (from the run, the prompt and the sample's index: a re-run asks "
                                "the same seeds) and its own row (columns sample, seed). Not with --turns all."),
    until_verified: Optional[int] = typer.Option(None, "--until-verified", min=1, metavar="K",
                                                 help="Sample each prompt until K of its samples pass --verify, "
                                                      "at most --samples N in all: only what failed is sampled "
                                                      "again (docs/data/samples.md)."),
    max_queued: int = typer.Option(100_000, min=0, metavar="N",
                                   help="Hold back while the queue is deeper than this (0: never)."),
    max_line_bytes: int = typer.Option(MAX_LINE_BYTES, min=1, metavar="N", help="A longer line is reported and "
                                       "skipped (default 16 MiB), never held in memory."),
    verify: Optional[str] = typer.Option(None, "--verify", metavar="NAME",
                                         help="Check each sample's answer while the run goes on, and store the "
                                              "verdict with it (columns verified, verdict): math (the last "
                                              "\\boxed{} against the line's answer field, by math-verify), exact "
                                              "(the answer equals the line's answer field), regex:PATTERN (re.search "
                                              "finds PATTERN in the answer), or module:function (your own check, "
                                              "importable here and on every worker; docs/data/verification.md)."),
    messages_column: Optional[str] = typer.Option(None, metavar="NAME",
                                                  help="The field (column) holding the conversation: messages, "
                                                       "ShareGPT turns or a prompt string, by its value "
                                                       "(default: messages, conversations or prompt)."),
    id_column: str = typer.Option("id", metavar="NAME", help="The field (column) holding each prompt's id "
                                  "(absent: an id derived from the content)."),
    run: Optional[str] = run_option(),
    redis_url: Optional[str] = redis_option(),
) -> None:
    """Tokenize each prompt with the chat template and publish one task per prompt.

    PROMPTS is a JSONL file, a Parquet file, or a folder a Hugging Face dataset
    was saved to (save_to_disk), each read as a stream; a table's rows are read
    as lines are (other columns carried as a line's other fields), a bad row
    reported with its row number (from 0).

    A content may be a string or OpenAI's list of text parts (joined with a
    space, as SGLang does). A malformed line (bad UTF-8 or JSON, JSON nested too
    deeply, a number, boolean or null where text belongs, a NUL character, a
    lone surrogate, a line over --max-line-bytes, a content part other than
    text) or a prompt the chat template refuses is reported with its line number
    and reason and skipped; the others are published, and the exit status is 1.
    A file with no prompt at all (empty, or blank lines only) fails (exit 1), as
    does a tokenizer that is neither a folder nor a hub id (exit 2), each in one
    line; the summary names the tokenizer used. A --verify NAME that names no
    verifier (an unknown name, a pattern that is no regular expression, a
    module:function that does not import here) is refused (exit 2).
    """
    from .tokenizer_choice import TokenizerUnavailable, choose, load_chat

    from .enqueue import SamplesRefused, check_samples

    name = run_name(run)
    if verify is not None:
        _check_verifier(verify, turns)
    try:
        check_samples(samples, turns, until_verified, verify)
    except SamplesRefused as exc:
        raise fail(str(exc))
    try:
        chosen = choose(tokenizer)
    except TokenizerUnavailable as exc:
        raise fail(str(exc))
    from .prompt_tables import TableRefused, TableSource, is_table
    from .prompts import Columns

    columns, size = Columns(messages_column, id_column), None
    if is_table(prompts):
        try:
            size = TableSource(prompts, columns).size  # a table refused whole, before a run is recorded
        except TableRefused as exc:
            raise fail(str(exc))
    else:
        check_has_prompts(prompts)
    settings, client = connect(redis_url)
    from contract.redis_link.replication import FailedOver
    from contract.run.spec import OlderLayout

    from .enqueue import RunMismatch, enqueue_file, new_spec, prepare_run
    from .prompt_tables import may_carry_sampling

    try:
        chat = load_chat(chosen, trust_remote_code, think_start, think_end)
    except TokenizerUnavailable as exc:
        raise fail(str(exc))
    spec = new_spec(chat, name, chosen.name, max_new_tokens, temperature, top_p, thinking,
                    served_model, disable_rule, turns, trust_remote_code, verify, logprobs=logprobs,
                    line_fields=may_carry_sampling(prompts), samples=samples,
                    until_verified=until_verified)
    try:
        spec = prepare_run(client, spec)
    except (RunMismatch, OlderLayout) as exc:
        raise fail(str(exc))
    celery_app = publisher(settings)

    size = prompts.stat().st_size if size is None else size
    with Progress(TextColumn("enqueue"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("read", total=size)
        try:
            summary = enqueue_file(prompts, spec, chat, client, celery_app, settings.queue_prefix,
                                   max_prompt_tokens, on_progress=lambda pos: bar.update(task, completed=pos),
                                   max_queue_depth=max_queued, max_line_bytes=max_line_bytes, columns=columns)
        except FailedOver as exc:
            err.print(f"[red]{escape(str(exc))}[/red]: run the same enqueue again; it publishes only "
                      "what the new primary lacks")
            raise typer.Exit(3)
    _print_enqueue_summary(summary, spec.thinking, spec.samples, spec.until_verified)
    out.print(chosen.summary_line(), highlight=False, soft_wrap=True)
    if not (summary.published or summary.rejected_count or summary.skipped):  # a pipe that gave nothing
        raise no_prompts(prompts)
    if summary.rejected:
        raise typer.Exit(1)


def _check_verifier(name: str, turns: str) -> None:
    """A --verify NAME the workers can run, or exit 2 with one line (contract/run/verifiers.py)."""
    from contract.run.verifiers import BadVerifier, check_importable, parse_name

    if turns == ALL:
        raise fail("--verify checks one answer per prompt; it does not go with --turns all")
    try:
        check_importable(parse_name(name))
    except BadVerifier as exc:
        raise fail(str(exc))


def _print_enqueue_summary(summary, mode: str, samples: int = 1, until_verified: int | None = None) -> None:
    def say(text: str) -> None:  # the file's own text (an id): one line, no markup, controls shown
        err.print(visible(text), markup=False, highlight=False, soft_wrap=True)

    for item in summary.rejected[:50]:
        say(f"{summary.unit} {item.line}: {item.reason}" + (f" (id {item.id})" if item.id else ""))
    if summary.rejected_count > 50:
        say(f"... and {summary.rejected_count - 50:,} more rejected {summary.unit}s")
    for item in summary.duplicates[:20]:
        say(f"{summary.unit} {item.line}: {item.reason}: {item.id}")
    if summary.duplicate_count > 20:
        say(f"... and {summary.duplicate_count - 20:,} more duplicate {summary.unit}s")
    table = Table(title=f"enqueue: run {summary.run!r} -> queue {summary.queue!r} (thinking: {mode})")
    for column in ("published", "prompt tokens", "skipped (already in run)", "duplicates", "rejected", "prompts/s"):
        table.add_column(column, justify="right")
    rate = summary.published / summary.seconds if summary.seconds else 0.0
    already = ", ".join(f"{k}={v:,}" for k, v in sorted(summary.already.items())) or "0"
    table.add_row(f"{summary.published:,}", f"{summary.prompt_tokens:,}", already,
                  f"{summary.duplicate_count:,}", f"{summary.rejected_count:,}", f"{rate:,.0f}")
    out.print(table)
    if samples > 1:
        from contract.run.samples import per_prompt

        later = "; a sample that fails queues the next" if until_verified else ""
        out.print(f"{counted(summary.published, 'sample')} of {counted(summary.prompts, 'prompt')} published "
                  f"({per_prompt(samples, until_verified)}{later}; the prompts counted in skipped, duplicates and "
                  f"rejected are whole prompts)",
                  highlight=False)
    if summary.held_back:
        out.print(f"held back {summary.held_back:.0f}s while the queue was deeper than --max-queued")


@app.command(cls=Command, short_help="Where a run stands: counts, rates, ETA, servers, workers.")
def status(run: Optional[str] = run_option(), as_json: bool = json_option(),
           watch: Optional[float] = typer.Option(None, "--watch", min=0.1, metavar="SECONDS",
                                                 help="Refresh every SECONDS seconds."),
           redis_url: Optional[str] = redis_option()) -> None:
    """Queued, in flight, done, dead by reason, rates, ETA, servers and workers."""
    name = run_name(run)
    settings, client = connect(redis_url)
    from rich.live import Live

    from .status import collect_status
    from .status_view import render_status

    spec = load_run(client, name)
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


@app.command(cls=Command, short_help="The runs in Redis, with their counts and where their shards are.")
def runs(as_json: bool = json_option(), redis_url: Optional[str] = redis_option()) -> None:
    """Every run in Redis: its prompts by state, and where its workers wrote its shards."""
    _, client = connect(redis_url)
    from .runs import list_runs

    found = list_runs(client)
    if as_json:
        sys.stdout.write(json.dumps(found) + "\n")
        return
    # The counts in a table; where the shards are and what made them as lines under it, so a
    # path or a model's name is never cut mid-word at 80 columns (a table would fold it).
    table = Table(title="runs")
    for column in ("run", "prompts", "queued", "done", "dead"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for item in found:
        table.add_row(item["run"], *(f"{item[k]:,}" for k in ("prompts", "queued", "done", "dead")))
    if not found:
        table.add_row("no run yet", "", "", "", "")
    out.print(table)
    for item in found:
        made = "; ".join(filter(None, (", ".join(item.get("models", [])),
                                       ", ".join(f"SGLang {v}" for v in item.get("sglang_versions", [])),
                                       ", ".join(f"weights {w}" for w in item.get("weight_versions", [])))))
        where = item.get("refused") or ", ".join(item["shards"]) or "none written yet"
        out.print(visible(f"{item['run']}\n  shards   {where}\n  made by  {made or '-'}", lines=True),
                  markup=False, highlight=False, soft_wrap=True)


@app.command(cls=Command, short_help="Write the finished dataset and a manifest to DEST.")
def export(dest: str = typer.Argument(..., metavar="DEST", help="A new or empty folder, or a previous export to "
                                      "replace; or s3://bucket/prefix (read it through its manifest.json)."),
           run: Optional[str] = run_option(),
           rows_per_file: int = typer.Option(10_000, min=1, metavar="N", help="Rows in each file written."),
           jobs: int = typer.Option(0, min=0, metavar="N", help="Processes sharing the shards (0: one per GiB of "
                                    "shards, at most one per core and 8)."),
           index_only: bool = typer.Option(False, "--index-only", help="Write keep-*.parquet, the (shard, id) "
                                           "of each canonical row, instead of copying the rows."),
           format: str = choice("parquet", "--format", values=("parquet", "specforge", "speculators", "text"),
                                metavar="FORMAT", help="parquet: the rows as stored; specforge, speculators: "
                                "JSONL of input_ids and loss_mask; text: decoded messages."),
           prompts: list[Path] = typer.Option([], "--prompts", metavar="FILE", help="text: the input file(s), for "
                                              "the system and user messages before each answer."),
           trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                                  help="text: needed to load tokenizers such as Kimi-K2.5's."),
           complete_only: bool = typer.Option(False, "--complete-only", help="A run of conversations "
                                              "(--turns all): only the turns of conversations whose every "
                                              "turn is stored."),
           verified_only: bool = typer.Option(False, "--verified-only", help="A run with a verifier (enqueue "
                                              "--verify): only the samples whose answer passed (verified true); "
                                              "the others are counted by verdict in the manifest's left_out."),
           redis_url: Optional[str] = redis_option()) -> None:
    """Write the finished dataset (each done id once) and a manifest to DEST.

    Exporting again into the same DEST replaces the previous export in one step:
    the new one is written into a folder beside DEST and swapped in, so a reader
    of DEST/*.parquet sees the old export or the new one, never both. A DEST that
    holds anything else is refused (exit 2) and left alone. Samples whose prompt
    the ledger does not mark done (dead-lettered since, or queued again) are left
    out and counted in the manifest. Fewer samples found than the ledger counts as
    done (the shards read in the wrong place, or some gone) fails (exit 1) and
    leaves DEST as it was. --index-only copies nothing: readers of the shards in
    place (DuckDB, Spark) semi-join them with DEST/keep-*.parquet. --format writes
    the same rows for a trainer (docs/data/exports.md). --verified-only keeps
    only the samples the run's verifier passed, and counts the others by verdict
    (verdict:fail, verdict:error) among those left out.
    """
    from .formats import FormatRefused

    if index_only and format != "parquet":
        raise fail("--index-only goes with --format parquet only")
    name = run_name(run)
    settings, client = connect(redis_url)
    from contract.storage.shard_home import Shortfall
    from contract.storage import UnsupportedOutput, store_for

    from .export import export_run
    from .export_bucket import is_bucket
    from .export_folder import ExportRefused, check_replaceable

    spec = load_run(client, name)
    if complete_only and spec.turns != "all":
        raise fail(f"--complete-only is for a run of conversations (enqueue --turns all); run {name!r} "
                   f"has one generation per prompt")
    if verified_only and not spec.verify:
        raise fail(f"--verified-only is for a run with a verifier (enqueue --verify NAME); run {name!r} has none")
    where = shards_of(settings, client, spec)
    try:
        if not is_bucket(dest):  # raises UnsupportedOutput (gs://...)
            check_replaceable(Path(dest).resolve())
        total = len(store_for(where).shards(spec.name))
        with reading(where), Progress(TextColumn("export"), BarColumn(), TextColumn("{task.completed}/{task.total} shards"),
                      console=err, transient=True) as bar:
            task = bar.add_task("export", total=total)
            manifest = export_run(spec, client, where, dest, rows_per_file,
                                  on_progress=lambda n: bar.update(task, completed=n),
                                  jobs=jobs, redis_url=settings.redis_url, index_only=index_only, format=format,
                                  format_options={"prompts": prompts, "trust_remote_code": trust_remote_code},
                                  complete_only=complete_only, verified_only=verified_only)
    except (ExportRefused, FormatRefused, UnsupportedOutput) as exc:
        raise fail(str(exc))
    except Shortfall as exc:
        raise fail(str(exc), 1)
    left_out = ", ".join(f"{k}={v:,}" for k, v in manifest["left_out"].items()) or "none"
    letters = ", ".join(f"{k}={v:,}" for k, v in manifest["dead_letters"].items()) or "none"
    what = "indexed" if index_only else "exported"
    target = dest if is_bucket(dest) else Path(dest).resolve()
    from contract.run.samples import per_prompt

    several = (f" of {counted(manifest['prompts'], 'prompt')} ({per_prompt(spec.samples, spec.until_verified)})"
               if spec.samples > 1 else "")
    out.print(f"{what} {counted(manifest['rows'], 'sample')}{several} ({counted(manifest['duplicates_dropped'], 'duplicate')} dropped, "
              f"left out{' as not done or not verified' if verified_only else ' as not done'}: {left_out}) into {counted(len(manifest['files']), 'file')} under {target}, "
              f"from {manifest['source']}; dead letters: {letters}", highlight=False, soft_wrap=True)
    if "format" in manifest:
        figures = manifest["format"]
        out.print(f"format {figures['name']}: {counted(figures['rows'], 'row')}, "
                  f"{counted(figures['prompt_tokens'], 'prompt token')} (loss mask 0), "
                  f"{counted(figures['generated_tokens'], 'generated token')} (loss mask 1), longest row "
                  f"{counted(figures['max_row_tokens'], 'token')}", highlight=False, soft_wrap=True)


@app.command(cls=Command, short_help="Run the whole job on this machine, and show the result.")
def demo(prompts: Optional[Path] = typer.Option(None, metavar="FILE", help="Default: the bundled examples."),
         workdir: Path = typer.Option(Path("demo-run"), metavar="DIR",
                                      help="Its Redis, logs, shards and exports go here.")) -> None:
    """Run the whole job on this machine with embedded defaults, and show the result. Its
    state stays under DIR: the commands it prints at the end work as printed."""
    import importlib.util

    missing = [m for m in ("matplotlib", "prometheus_client", "starlette", "uvicorn")
               if importlib.util.find_spec(m) is None]
    if missing:  # the demo runs every role here
        raise fail(f"the demo runs a worker and SGLang stand-ins, and this install lacks {', '.join(missing)}: "
                   "pip install -e '.[producer,worker,standin]' (or run scripts/demo.sh)")
    from .demo import run_demo

    raise typer.Exit(run_demo(prompts, workdir, out))


@app.command(cls=Command, short_help="Write one self-contained HTML page about a run.")
def report(run: Optional[str] = run_option(),
           out_path: Path = typer.Option(Path("report.html"), "--out", metavar="FILE",
                                         help="Where to write the page."),
           trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                                  help="Needed to load tokenizers such as Kimi-K2.5's."),
           redis_url: Optional[str] = redis_option()) -> None:
    """One self-contained HTML page about a run: lengths, finishes, dead letters, speed,
    servers, examples. Fewer samples in the shards than the ledger counts as done fails
    (exit 1), and writes no page."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:  # the producer extra's one package
        raise fail("the report draws its charts with matplotlib, which this install lacks: "
                   "pip install 'reasoning-fleet[producer]'")
    settings, client = connect(redis_url)
    from contract.storage.shard_home import Shortfall

    from .report import build_report

    spec = load_run(client, run)
    where = shards_of(settings, client, spec)
    try:
        with reading(where):
            data = build_report(client, spec, where, settings.queue_prefix, out_path, trust_remote_code)
    except Shortfall as exc:
        raise fail(str(exc), 1)
    out.print(f"report of run {spec.name!r} ({counted(data['samples']['unique_ids'], 'sample')}, "
              f"{counted(data['dead_letters']['total'], 'dead letter')}): {out_path.resolve()}", highlight=False,
              soft_wrap=True)


@app.command(cls=Command, short_help="One sample or dead letter, decoded.")
def show(prompt_id: str = typer.Argument(..., metavar="ID", help="The prompt's id (its line's \"id\")."),
         sample: Optional[int] = sample_option(),
         run: Optional[str] = run_option(),
         ids: bool = typer.Option(False, "--ids", help="Also list every token: position, id, text."),
         trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                                help="Needed to load tokenizers such as Kimi-K2.5's."),
         redis_url: Optional[str] = redis_option()) -> None:
    """One stored sample (or dead letter) decoded: prompt, reasoning, answer, special
    tokens, provenance. `dead show ID` shows a dead letter the same way."""
    settings, client = connect(redis_url)
    from contract.ledger.deadletters import DeadLetters
    from contract.ledger.ledger import Ledger
    from contract.names import PromptState
    from contract.storage import store_for

    from .show import find_samples, letter_view, sample_view

    spec = load_run(client, run)
    prompt_id = ledger_key(spec, prompt_id, sample)  # in a run of several samples a prompt: one sample's
    where = shards_of(settings, client, spec)
    with reading(where):
        rows = find_samples(where, spec.name, [prompt_id], spec.samples).get(prompt_id)
    if rows:
        print_shown(sample_view(rows, spec), spec, trust_remote_code, ids)
        return
    state = Ledger(client, spec.name).state(prompt_id)
    if state == PromptState.DONE:
        raise fail(f"prompt {prompt_id!r} of run {spec.name!r} is done in the ledger, but no shard under "
                   f"{store_for(where).where(spec.name)} holds it; set OUTPUT_DIR to where the workers "
                   f"wrote them (python -m producer runs lists each run's)", 1)
    letter = DeadLetters(client, spec.name).get(prompt_id)
    if letter is None:
        why = "still queued or in flight" if state == PromptState.QUEUED else "not in the run"
        raise fail(f"no sample or dead letter with id {prompt_id!r} in run {spec.name!r} (the prompt is {why})", 1)
    print_shown(letter_view(letter, spec), spec, trust_remote_code, ids)


def main() -> None:
    """Run a command; Redis refusing writes (out of memory, read-only, no replicas) ends it with
    one line and exit status 3, never a traceback. What a command wrote before is safe: `enqueue`
    records each prompt before publishing it, so a re-run publishes only what is missing."""
    from pydantic import ValidationError

    from contract.settings import settings_refusal
    from contract.redis_link.write_refusal import refusal

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
