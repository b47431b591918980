"""The first run: the whole job on this machine, on embedded defaults.

Starts what is not configured (a Redis-compatible server when `REDIS_URL` is
unset, two SGLang stand-ins when `SGLANG_URLS` is unset), a real Celery
worker, enqueues the bundled example prompts with the bundled tokenizer, waits
for every prompt to be stored or dead-lettered, exports the dataset and prints
what a user would check, and ends by writing the run's report page
(`python -m producer report`) into the work directory. With the bundled
examples it then regenerates the example conversations turn by turn
(`demo_conversations.py`) and shows one, decoded turn by turn.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .local import start_redis, start_standin, start_worker

EXAMPLES = Path(__file__).parent / "examples" / "prompts.jsonl"
RUN = "demo"
# A few faults, so that the first run also shows dead letters and retries at work.
DEMO_FAULTS = ("--fault-missing-think-end", "0.02", "--fault-truncate", "0.02",
               "--fault-truncate-tokens", "6000", "--fault-http500-first", "0.03")


def run_demo(prompts: Path | None, workdir: Path, console: Console) -> int:
    prompts = prompts or EXAMPLES
    workdir = workdir.resolve()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the processes we started are stopped
    shutil.rmtree(workdir / "export", ignore_errors=True)
    logs = workdir / "logs"
    with ExitStack() as stack:
        env = _fleet_env(stack, workdir, logs, console)
        console.print("starting a worker: celery -A workers worker")
        worker = start_worker(logs, "demo-worker", env)
        stack.callback(worker.stop)
        started = time.monotonic()
        enqueue = [sys.executable, "-m", "producer", "enqueue", str(prompts), "--run", RUN,
                   "--max-new-tokens", "4096"]
        console.print(f"$ {' '.join(enqueue[1:])}")
        code = subprocess.call(enqueue, env={**os.environ, **env})
        if code not in (0, 1):
            console.print(f"[red]enqueue failed ({code})[/red]")
            return code
        report = _wait(env, console, worker)
        seconds = time.monotonic() - started
        subprocess.check_call([sys.executable, "-m", "producer", "export", str(workdir / "export"),
                               "--run", RUN], env={**os.environ, **env})
        _print_result(report, env["OUTPUT_DIR"], workdir, seconds, console)
        page = workdir / "report.html"
        code = subprocess.call([sys.executable, "-m", "producer", "report", "--run", RUN, "--out", str(page)],
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL)
        console.print(f"report (open it in a browser): {page}" if code == 0 else f"[red]report failed ({code})[/red]")
        if prompts == EXAMPLES:  # the bundled examples: then whole conversations, turn by turn
            from .demo_conversations import run_conversations

            run_conversations(env, workdir, console, worker)
    return 0 if report["finished"] else 1


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _fleet_env(stack: ExitStack, workdir: Path, logs: Path, console: Console) -> dict[str, str]:
    env = {"OUTPUT_DIR": os.environ.get("OUTPUT_DIR") or str(workdir / "shards"), "FLEET_RUN": RUN}
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    else:
        shutil.rmtree(logs / "redis", ignore_errors=True)
        shutil.rmtree(workdir / "shards" / RUN, ignore_errors=True)  # a fresh Redis: a fresh run
        process, env["REDIS_URL"] = start_redis(logs, data_dir=logs / "redis")
        stack.callback(process.stop)
        console.print(f"REDIS_URL unset: started a local server at {env['REDIS_URL']}")
    if os.environ.get("SGLANG_URLS"):
        env["SGLANG_URLS"] = os.environ["SGLANG_URLS"]
    else:
        urls = []
        for _ in range(2):
            process, url = start_standin(logs, None, "--max-running-requests", "64", *DEMO_FAULTS)
            stack.callback(process.stop)
            urls.append(url)
        env["SGLANG_URLS"] = ",".join(urls)
        console.print(f"SGLANG_URLS unset: started two SGLang stand-ins at {env['SGLANG_URLS']}")
    return env


def _wait(env: dict[str, str], console: Console, worker, timeout: float = 900) -> dict:
    from contract.connections import redis_for
    from contract.deadletters import DeadLetters
    from contract.settings import SharedSettings
    from contract.spec import load_spec

    from .status import collect_status

    settings = SharedSettings(redis_url=env["REDIS_URL"], output_dir=env["OUTPUT_DIR"])
    client = redis_for(settings.redis_url)
    spec = load_spec(client, RUN)
    deadline = time.monotonic() + timeout
    with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("dead {task.fields[dead]}"), TimeElapsedColumn(), console=console) as bar:
        report = collect_status(client, spec, settings.queue_prefix)
        task = bar.add_task("gen", total=report["prompts"], dead=0)
        while not report["finished"] and time.monotonic() < deadline and worker.alive():
            time.sleep(0.5)
            report = collect_status(client, spec, settings.queue_prefix)
            bar.update(task, completed=report["done"] + report["dead"], dead=report["dead"])
    if not worker.alive():
        console.print(f"[red]the worker exited:[/red]\n{worker.tail()}")
    report["examples"] = [d.summary() for d in DeadLetters(client, RUN).select()[:5]]
    return report


def _print_result(report: dict, output_dir: str, workdir: Path, seconds: float, console: Console) -> None:
    shards = sorted(Path(output_dir, RUN).glob("*.parquet"))
    table = Table(title="result", show_header=False)
    table.add_row("samples stored", str(report["done"]))
    table.add_row("dead letters", str(report["dead"]))
    for reason, count in report["dead_by_reason"].items():
        table.add_row(f"  {reason}", str(count))
    table.add_row("still pending", str(report["pending"]))
    table.add_row("output tokens", f"{report['output_tokens']:,}")
    table.add_row("tokens/s (output, wall clock)", f"{report['output_tokens'] / seconds:,.0f}")
    table.add_row("shards", f"{len(shards)} files in {Path(output_dir, RUN)}")
    for path in shards[:5]:
        table.add_row("", path.name)
    table.add_row("export", str(workdir / "export"))
    console.print(table)
    if report["dead"]:
        console.print("each dead letter says why (python -m producer dead list), e.g.:")
        for letter in report.get("examples", []):
            console.print(f"  {letter['id']}: {letter['reason']}: {letter['message']}")
