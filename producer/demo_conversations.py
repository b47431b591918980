"""The demo's second part: whole conversations regenerated turn by turn (`enqueue --turns all`).

The example conversations (`examples/conversations.jsonl`) go through the same
worker as a second run; once every conversation is complete or stopped, the
complete ones are exported (`export --complete-only`) and one of them is
decoded turn by turn: each turn's prompt ends with the model's own earlier
answers, never the file's original ones.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from contract.counts import counted
from .visible import visible

CONVERSATIONS = Path(__file__).parent / "examples" / "conversations.jsonl"
RUN = "demo-chat"


def run_conversations(env: dict[str, str], workdir: Path, console: Console, worker, producer,
                      timeout: float = 600) -> dict:
    """Enqueue the example conversations, wait for them, export the complete ones, show one;
    returns the conversations' counts. `producer(console, env, *args, check=, quiet=)` runs
    and echoes a producer command (`demo._producer`)."""
    producer(console, env, "enqueue", str(CONVERSATIONS), "--run", RUN, "--turns", "all", "--max-new-tokens", "4096")
    report = _wait(env, worker, timeout)
    talks = report.get("conversations", {})
    console.print(f"conversations: {talks.get('complete', 0):,} complete, {talks.get('stopped', 0):,} stopped "
                  f"(a turn dead-lettered), {talks.get('in_progress', 0):,} in progress; turns stored: "
                  f"{talks.get('turns_done', 0):,} of {talks.get('turns', 0):,}", highlight=False)
    dest = workdir / "export-chat"
    producer(console, env, "export", str(dest), "--run", RUN, "--complete-only", check=True)
    _show_one(dest, console)
    return talks


def _wait(env: dict[str, str], worker, timeout: float) -> dict:
    from contract.redis_link.connections import redis_for
    from contract.settings import SharedSettings
    from contract.run.spec import load_spec

    from .status import collect_status

    settings = SharedSettings(redis_url=env["REDIS_URL"], output_dir=env["OUTPUT_DIR"])
    client = redis_for(settings.redis_url)
    spec = load_spec(client, RUN)
    deadline = time.monotonic() + timeout
    report = collect_status(client, spec, settings.queue_prefix)
    while not report["finished"] and time.monotonic() < deadline and worker.alive():
        time.sleep(0.5)
        report = collect_status(client, spec, settings.queue_prefix)
    return report


def _show_one(dest: Path, console: Console) -> None:
    """The complete conversation with the most turns, decoded turn by turn."""
    import pyarrow.parquet as pq

    from contract.chat.template import ChatTokenizer

    rows = [r for f in sorted(dest.glob("part-*.parquet"))
            for r in pq.read_table(f, columns=["conversation", "turn", "input_ids", "prompt_len"]).to_pylist()]
    if not rows:
        console.print("no conversation was complete")
        return
    turns: dict[str, list[dict]] = {}
    for row in rows:
        turns.setdefault(row["conversation"], []).append(row)
    conversation, chosen = max(sorted(turns.items()), key=lambda item: len(item[1]))
    tok = ChatTokenizer("bundled").tok
    console.print(f"\nconversation {conversation}, regenerated turn by turn ({counted(len(rows), 'turn')} exported):")
    for row in sorted(chosen, key=lambda r: r["turn"]):
        prompt, output = row["input_ids"][:row["prompt_len"]], row["input_ids"][row["prompt_len"]:]
        console.print(f"turn {row['turn']}: prompt of {counted(len(prompt), 'token')}, ending "
                      f"…{visible(repr(tok.decode(prompt[-60:])))}", markup=False, highlight=False)
        console.print(f"  output of {counted(len(output), 'token')}: {visible(repr(tok.decode(output)[:160]))}…",
                      markup=False, highlight=False)
