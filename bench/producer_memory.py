"""Producer memory: peak RSS of `python -m producer enqueue` for n and 4n lines.

The producer streams its input in batches, so its peak memory should not grow
with the file. Each size runs the real CLI as a child process against the
bench's Redis, and the child's own peak RSS comes from wait4.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .lab import ROOT, Lab
from .procs import run_measured
from .prompts import repeated, write_jsonl


@dataclass
class ProducerMemoryOptions:
    lines: int = 2000   # n; the second run has 4n
    timeout: float = 900.0


def run_producer_memory(lab: Lab, opts: ProducerMemoryOptions, log) -> dict:
    runs = {}
    for label, count in (("n", opts.lines), ("4n", 4 * opts.lines)):
        lab.flush()
        path = write_jsonl(lab.root / "prompts" / f"producer-mem-{count}.jsonl", repeated(count))
        log(f"producer memory: python -m producer enqueue ({count} lines)")
        argv = [sys.executable, "-m", "producer", "enqueue", str(path), "--run", f"pm-{label}",
                "--redis-url", lab.redis_url]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": lab.redis_url}
        child = run_measured(argv, env, cwd=str(ROOT), timeout=opts.timeout)
        if child.returncode != 0:
            raise RuntimeError(f"producer enqueue exited {child.returncode}:\n{child.output[-2000:]}")
        runs[label] = {"lines": count, "peak_rss_bytes": child.hwm_bytes,  # not ru_maxrss: see procs.py
                       "wall_s": child.wall_seconds, "cpu_s": child.cpu_seconds}
    lab.flush()
    return {"n": opts.lines, "runs": runs,
            "ratio": runs["4n"]["peak_rss_bytes"] / runs["n"]["peak_rss_bytes"]}
