"""The first run: the whole job on this machine, on embedded defaults.

Starts what is not configured (a Redis-compatible server when `REDIS_URL` is
unset, two SGLang stand-ins when `SGLANG_URLS` is unset), a real Celery
worker, enqueues the bundled example prompts with the bundled tokenizer, waits
for every prompt to be stored or dead-lettered, exports the dataset and prints
what a user would check, and writes the run's report page
(`python -m producer report`) into the work directory. With the bundled
examples it then regenerates the example conversations turn by turn
(`demo_conversations.py`) and shows one, decoded turn by turn.

The demo keeps its state: the Redis it starts is append-only, keeps its data
under the work directory (`demo_redis.py`) and keeps running after the demo,
so the commands it prints at the end (`demo_view.py`) work as printed; the
next demo stops it and starts afresh.
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

from contract.chat.bundled import bundled_tokenizer_dir

from . import demo_redis
from .demo_view import command_line, print_next_steps, print_result
from .local import start_standin, start_worker
from .visible import visible

EXAMPLES = Path(__file__).parent / "examples" / "prompts.jsonl"
RUN = "demo"
RUNS = (RUN, "demo-chat")  # the runs a fresh demo starts afresh (demo_conversations.RUN)
# A few faults, so that the first run also shows dead letters and retries at work.
DEMO_FAULTS = ("--fault-missing-think-end", "0.02", "--fault-truncate", "0.02",
               "--fault-truncate-tokens", "6000", "--fault-http500-first", "0.03")


def run_demo(prompts: Path | None, workdir: Path, console: Console) -> int:
    prompts = prompts or EXAMPLES
    workdir = workdir.resolve()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the processes we started are stopped
    logs = workdir / "logs"
    for folder in ("export", "export-chat", "logs"):  # each demo's logs are its own
        shutil.rmtree(workdir / folder, ignore_errors=True)
    with ExitStack() as stack:
        env, kept = _fleet_env(stack, workdir, logs, console)
        console.print(f"starting a worker: {command_line(['-m', 'celery', '-A', 'workers', 'worker'])}",
                      highlight=False)
        worker = start_worker(logs, "demo-worker", env)
        stack.callback(worker.stop)
        started = time.monotonic()
        code = _producer(console, env, "enqueue", str(prompts), "--run", RUN, "--max-new-tokens", "4096")
        if code not in (0, 1):
            console.print(f"[red]enqueue failed ({code})[/red]")
            return code
        report = _wait(env, console, worker)
        seconds = time.monotonic() - started
        _producer(console, env, "export", str(workdir / "export"), "--run", RUN, check=True)
        print_result(report, env["OUTPUT_DIR"], workdir, seconds, console)
        page = workdir / "report.html"
        code = _producer(console, env, "report", "--run", RUN, "--out", str(page), quiet=True)
        console.print(f"report (open it in a browser): {page}" if code == 0 else f"[red]report failed ({code})[/red]",
                      highlight=False, soft_wrap=True)
        talks = None
        if prompts == EXAMPLES:  # the bundled examples: then whole conversations, turn by turn
            from .demo_conversations import run_conversations

            talks = run_conversations(env, workdir, console, worker, _producer)
    print_next_steps(report, talks, env, kept, workdir, time.monotonic() - started, console)
    return 0 if report["finished"] else 1


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _producer(console: Console, env: dict[str, str], *args: str, check: bool = False, quiet: bool = False) -> int:
    """`python -m producer ARGS` in the demo's environment, echoed as a user would type it."""
    argv = ["-m", "producer", *args]
    if not quiet:
        console.print(f"$ {command_line(argv)}", highlight=False, soft_wrap=True)
    run = subprocess.check_call if check else subprocess.call
    return run([sys.executable, *argv], env={**os.environ, **env},
               stdout=subprocess.DEVNULL if quiet else None)


def _fleet_env(stack: ExitStack, workdir: Path, logs: Path, console: Console) -> tuple[dict[str, str], dict | None]:
    """The fleet's environment, and the Redis the demo started and keeps (None: `REDIS_URL` was set)."""
    env = {"OUTPUT_DIR": os.environ.get("OUTPUT_DIR") or str(workdir / "shards"), "FLEET_RUN": RUN}
    kept = None
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    else:
        for run in RUNS:  # a fresh Redis: fresh runs
            shutil.rmtree(Path(env["OUTPUT_DIR"]) / run, ignore_errors=True)
        kept = demo_redis.start(workdir, logs)
        env["REDIS_URL"] = kept["url"]
        console.print(f"REDIS_URL unset: started a local append-only Redis at {kept['url']} (its data: "
                      f"{kept['dir']}; it keeps running after the demo)", highlight=False, soft_wrap=True)
    if os.environ.get("SGLANG_URLS"):
        env["SGLANG_URLS"] = os.environ["SGLANG_URLS"]
    else:
        urls = []
        for _ in range(2):
            # with the bundled tokenizer, so the worker's tokenizer check runs as against a real server
            process, url = start_standin(logs, None, "--max-running-requests", "64", "--tokenizer-path",
                                         str(bundled_tokenizer_dir()), *DEMO_FAULTS)
            stack.callback(process.stop)
            urls.append(url)
        env["SGLANG_URLS"] = ",".join(urls)
        console.print(f"SGLANG_URLS unset: started two SGLang stand-ins at {env['SGLANG_URLS']}", highlight=False,
                      soft_wrap=True)
    return env, kept


def _wait(env: dict[str, str], console: Console, worker, timeout: float = 900) -> dict:
    from contract.redis_link.connections import redis_for
    from contract.ledger.deadletters import DeadLetters
    from contract.settings import SharedSettings
    from contract.run.spec import load_spec

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
        console.print("the worker exited:", style="red")
        console.print(visible(worker.tail(), lines=True), markup=False, highlight=False)
    report["examples"] = [d.summary() for d in DeadLetters(client, RUN).select()[:5]]
    return report
