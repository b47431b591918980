"""`python -m producer dead ...`: inspect, replay and purge a run's dead letters."""
from __future__ import annotations

import itertools
import json
import sys
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from contract.names import Reason

from .cli_help import Command
from .cli_common import (choice, connect, err, fail, json_option, ledger_key, load_run, out, print_shown, publisher,
                         redis_option, run_option, sample_keys, sample_option)
from contract.counts import counted
from .visible import cell

dead_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="Inspect, replay and purge dead-lettered prompts.")
REASONS = tuple(map(str, Reason))


def reason_option(help: str):
    return choice([], "--reason", values=REASONS, metavar="REASON", help=f"{help} (repeatable).")


@dead_app.command("list", cls=Command, short_help="Dead letters with their reasons.")
def dead_list(run: Optional[str] = run_option(), reason: list[str] = reason_option("Only this reason code"),
              limit: int = typer.Option(0, min=0, metavar="N", help="At most N (0: all)."),
              as_json: bool = json_option(), redis_url: Optional[str] = redis_option()) -> None:
    """Dead-lettered prompts with their reasons, in the order of their ids (then samples), the
    same each time (`--json`: a JSON array); `dead stats` counts them."""
    _, client = connect(redis_url)
    from contract.ledger.deadletters import DeadLetters

    spec = load_run(client, run)
    name, several = spec.name, spec.samples > 1  # a run of several samples a prompt: each letter names its sample
    store = DeadLetters(client, name)
    letters = store.in_order(reason or None)
    if limit:
        letters = itertools.islice(letters, limit)
    if as_json:
        _stream_json(d.summary() for d in letters)
        return
    shown = 0
    for page in _pages(letters, 500):
        table = Table(title=None if shown else f"dead letters of run {name!r}", show_header=not shown)
        for column in ("id", *("sample",) * several, "reason", "attempts", "message"):
            table.add_column(column, overflow="fold")
        for d in page:
            table.add_row(cell(d.id), *(str(d.sample),) * several, d.reason, f"{d.attempts:,}", cell(d.message))
        out.print(table)
        shown += len(page)
    total = store.count(reason or None)
    out.print(f"{shown:,} dead letters shown" + (f" of {total:,}" if total != shown else ""), highlight=False)


def _stream_json(items) -> None:
    """A JSON array written an element at a time."""
    sys.stdout.write("[")
    for n, item in enumerate(items):
        sys.stdout.write(("," if n else "") + json.dumps(item, ensure_ascii=False))
    sys.stdout.write("]\n")


def _pages(items, size: int):
    iterator = iter(items)
    while page := list(itertools.islice(iterator, size)):
        yield page


@dead_app.command("show", cls=Command, short_help="One dead letter, decoded (or as JSON).")
def dead_show(prompt_id: str = typer.Argument(..., metavar="ID", help="The prompt's id."),
              sample: Optional[int] = sample_option(),
              run: Optional[str] = run_option(),
              ids: bool = typer.Option(False, "--ids", help="Also list every token: position, id, text."),
              trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                                     help="Needed to load tokenizers such as Kimi-K2.5's."),
              as_json: bool = json_option(), redis_url: Optional[str] = redis_option()) -> None:
    """One dead letter in full, decoded as `show ID` shows it (`--json`: the letter as JSON,
    with its prompt's token ids)."""
    _, client = connect(redis_url)
    from contract.ledger.codec import b64_to_ids
    from contract.ledger.deadletters import DeadLetters

    from .show import letter_view

    spec = load_run(client, run)
    key = ledger_key(spec, prompt_id, sample)
    letter = DeadLetters(client, spec.name).get(key)
    if letter is None:
        raise fail(f"no dead letter with id {key!r} in run {spec.name!r}", 1)
    if as_json:
        data = letter.summary() | {"prompt_ids": b64_to_ids(letter.prompt_b64)}
        sys.stdout.write(json.dumps(data) + "\n")  # ASCII: a control character stays an escape
        return
    print_shown(letter_view(letter, spec), spec, trust_remote_code, ids)


@dead_app.command("stats", cls=Command, short_help="Dead letters counted by reason.")
def dead_stats(run: Optional[str] = run_option(), as_json: bool = json_option(),
               redis_url: Optional[str] = redis_option()) -> None:
    """Dead letters counted by reason."""
    _, client = connect(redis_url)
    from contract.ledger.deadletters import DeadLetters

    stats = DeadLetters(client, load_run(client, run).name).stats()
    if as_json:
        sys.stdout.write(json.dumps(stats) + "\n")
        return
    for reason, count in stats.items():
        out.print(f"{reason:28} {count:>9,}", highlight=False)
    out.print(f"{'total':28} {sum(stats.values()):>9,}", highlight=False)


@dead_app.command("requeue", cls=Command, short_help="Queue dead-lettered prompts again.")
def dead_requeue(run: Optional[str] = run_option(), reason: list[str] = reason_option("Only this reason code"),
                 prompt_id: list[str] = typer.Option([], "--id", metavar="ID", help="Only this prompt (repeatable): "
                                                     "each of its dead samples, or one sample as ID~INDEX."),
                 max_new_tokens: Optional[int] = typer.Option(None, min=1, metavar="N",
                                                              help="A larger budget, e.g. for truncated prompts."),
                 yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
                 redis_url: Optional[str] = redis_option()) -> None:
    """Publish dead-lettered prompts again (all, or by --reason / --id), a page at a time as
    the letters are read."""
    settings, client = connect(redis_url)
    from contract.ledger.deadletters import DeadLetters

    from .dead import replayable, requeue

    spec = load_run(client, run)
    store = DeadLetters(client, spec.name)
    prompt_id = [key for given in prompt_id for key in sample_keys(spec, given)]
    pages = [store.select(reason or None, prompt_id)] if prompt_id else store.pages(reason or None)
    total = sum(len(p) for p in pages) if prompt_id else store.count(reason or None)
    if not total:
        out.print(f"nothing to requeue: run {spec.name!r} has no dead letter{_matching(reason, prompt_id)}",
                  highlight=False)
        return
    if not yes:
        typer.confirm(f"requeue {total:,} dead letters of run {spec.name!r}?", abort=True)
    count, seen, idless, sender = 0, 0, 0, publisher(settings)
    with Progress(TextColumn("requeue"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("requeue", total=total)
        for page in pages:
            idless += sum(not replayable(d) for d in page)
            count += requeue(client, sender, spec, page, settings.queue_prefix, max_new_tokens)
            seen += len(page)
            bar.update(task, completed=seen)
    out.print(f"requeued {counted(count, 'prompt')}" + (f" with max_new_tokens={max_new_tokens:,}" if max_new_tokens else ""),
              highlight=False)
    if idless:
        err.print(f"kept {idless:,} dead letters that hold no token ids (Redis had lost their prompts; "
                  "see `dead list --reason worker_error`): enqueue their lines again under a new run")


@dead_app.command("purge", cls=Command, short_help="Delete dead letters.")
def dead_purge(run: Optional[str] = run_option(), reason: list[str] = reason_option("Only this reason code"),
               yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
               redis_url: Optional[str] = redis_option()) -> None:
    """Delete dead letters (all, or by --reason), a page at a time. Their prompts stay marked dead."""
    _, client = connect(redis_url)
    from contract.ledger.deadletters import DeadLetters

    spec = load_run(client, run)
    store = DeadLetters(client, spec.name)
    total = store.count(reason or None)
    if not total:
        out.print(f"nothing to purge: run {spec.name!r} has no dead letter{_matching(reason, [])}", highlight=False)
        return
    if not yes:
        typer.confirm(f"delete {total:,} dead letters of run {spec.name!r}?", abort=True)
    purged = sum(store.remove([d.key for d in page]) for page in store.pages(reason or None))
    out.print(f"purged {purged:,} dead letters", highlight=False)


def _matching(reasons: list[str], ids: list[str]) -> str:
    said = [f"reason {', '.join(reasons)}"] * bool(reasons) + [f"id {', '.join(ids)}"] * bool(ids)
    return f" with {' and '.join(said)}" if said else ""
