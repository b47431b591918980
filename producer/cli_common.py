"""What every `python -m producer` command shares: its consoles, its options, and the few
steps before its work (reach Redis, find the run, find its shards), each ending the command
with one line and an exit status when it cannot go on.

Each command builds the settings once (flags over the environment) and passes them on;
importing this module reads nothing.
"""
from __future__ import annotations

import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from contract.counts import counted

out = Console()
err = Console(stderr=True, soft_wrap=True)  # messages stay one line each, whatever the width

RUN_HELP = "Run name (default: 'default')."


def run_option():
    return typer.Option(None, "--run", envvar="FLEET_RUN", metavar="NAME", help=RUN_HELP)


def redis_option():
    return typer.Option(None, "--redis-url", metavar="URL", help="Overrides REDIS_URL.")


def json_option():
    return typer.Option(False, "--json", help="Print JSON (one document) instead of tables.")


def choice(default, *names: str, values: Sequence[str], help: str, metavar: str):
    """An option whose values are one of `values`: any other is refused (exit 2) with the
    list of valid ones; a list option (default `[]`) checks each value."""
    def check(given):
        for value in given if isinstance(given, list) else [given]:
            if value is not None and value not in values:
                raise typer.BadParameter(f"{value!r} is not one of: {', '.join(values)}")
        return given

    return typer.Option(default, *names, callback=check, metavar=metavar, help=f"{help} One of: {', '.join(values)}.")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` (plain text, shown as is) as one red line on stderr; the exit to raise."""
    err.print(f"[red]{escape(message)}[/red]", highlight=False)
    return typer.Exit(code)


def check_has_prompts(path: Path) -> None:
    """Exit 1 naming the file when a regular file holds nothing but whitespace (empty, or blank
    lines only), before a run is recorded: a silent "published 0" reads as success. Reads only
    up to the first byte that is not whitespace; a pipe is left unread (`no_prompts` then)."""
    if not stat.S_ISREG(path.stat().st_mode):
        return
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 16):
            if chunk.strip():  # the whitespace `read_prompts` skips as a blank line
                return
    raise no_prompts(path)


def no_prompts(path: Path) -> typer.Exit:
    """The exit for a prompt file with no line to read (exit 1)."""
    if path.is_dir() or path.suffix.lower() == ".parquet":  # a table (producer/prompt_tables.py)
        return fail(f"no prompts in {path}: the table has no rows", 1)
    return fail(f"no prompts in {path}: the file is empty or holds only blank lines (each line is one JSON "
                f"prompt, e.g. {{\"id\": \"1\", \"prompt\": \"...\"}})", 1)


def connect(redis_url: str | None):
    """The shared settings (a --redis-url flag over REDIS_URL), and a Redis client, once
    one quick PING has shown that Redis answers (else exit 2 with the URL redacted)."""
    from contract.redis_link.connections import redis_for
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

    from contract.redis_link.connections import client_for, redact_text, redact_url

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


def publisher(settings):
    """A Celery app that only publishes (the worker's app is never built here)."""
    from contract.broker.config import celery_app

    return celery_app(settings.redis_url, queue=settings.queue_prefix)


def run_name(run: str | None) -> str:
    """The checked run name (None: 'default'); a bad one exits 2 before anything is written."""
    from contract.run.spec import BadRunName, check_run_name

    try:
        return check_run_name("default" if run is None else run)
    except BadRunName as exc:
        raise fail(str(exc))


def load_run(client, run: str | None):
    """The run's spec, or exit 2 saying why not (no such run: naming those there are; or one
    of an older layout)."""
    from contract.keys import RUNS
    from contract.run.spec import OlderLayout, load_spec

    name = run_name(run)
    try:
        spec = load_spec(client, name)
    except OlderLayout as exc:
        raise fail(str(exc))
    if spec is None:
        names = sorted(raw.decode() for raw in client.smembers(RUNS))
        there = f"runs there: {', '.join(names)}" if names else "no run there yet: enqueue one first"
        raise fail(f"no run named {name!r} in Redis ({there}; pass --run NAME)")
    return spec


def shards_of(settings, client, spec) -> str:
    """The OUTPUT_DIR to read the run's shards from (`producer/located.py`), or exit 2."""
    from .located import SeveralHomes, shards_at

    try:
        return shards_at(settings, client, spec)
    except SeveralHomes as exc:
        raise fail(str(exc))


@contextmanager
def reading(where: str) -> Iterator[None]:
    """Shards that cannot be read (gone mid-read, corrupt, refused by the store) end the command
    with one line and exit 1: never a count from what was read before, nor a traceback."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        raise fail(f"cannot read the shards under {where}: {exc.__class__.__name__}: {exc}"[:2000], 1)


def print_shown(shown, spec, trust_remote_code: bool, with_ids: bool) -> None:
    """A sample or dead letter as text (`show.render_text`), its control characters shown visibly."""
    from .show import load_decoder, render_text
    from .visible import visible

    text = render_text(shown, load_decoder(spec, trust_remote_code), with_ids=with_ids)
    sys.stdout.write(visible(text, lines=True))


def sample_option():
    return typer.Option(None, "--sample", min=0, metavar="INDEX",
                        help="A run of several samples a prompt (enqueue --samples): which sample (default 0).")


def ledger_key(spec, prompt_id: str, sample: int | None) -> str:
    """The ledger key of a prompt's sample (`contract/run/samples.py`): `--sample` (0 left out), or the
    key itself given as ID (`<id>~<index>`, as a queue message names it)."""
    from contract.run.samples import sample_key, split_sample_key

    if spec.samples == 1:
        if sample:
            raise fail(f"run {spec.name!r} takes one sample a prompt: there is no sample {sample}")
        return prompt_id
    if sample is None:
        try:
            split_sample_key(prompt_id, spec.samples)
            return prompt_id  # a key already
        except ValueError:
            sample = 0
    if sample >= spec.samples:
        raise fail(f"run {spec.name!r} takes {counted(spec.samples, 'sample')} a prompt (0 to {spec.samples - 1}), not {sample}")
    return sample_key(prompt_id, sample, spec.samples)


def sample_keys(spec, given: str) -> list[str]:
    """The ledger keys `--id ID` names: the ID in a run of one sample a prompt; else its every
    sample, or the one sample a key `<id>~<index>` names."""
    from contract.run.samples import sample_key, split_sample_key

    if spec.samples == 1:
        return [given]
    try:
        split_sample_key(given, spec.samples)
        return [given]
    except ValueError:
        return [sample_key(given, i, spec.samples) for i in range(spec.samples)]
