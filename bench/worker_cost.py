"""What one sample costs a worker process: CPU per sample and memory growth.

An instant stand-in (no modelled time) answers ~4,000-token outputs at once,
so the worker, not the server, is the limit, and everything its process
spends is the fleet's own overhead: consuming from Redis, the HTTP call and
JSON decode, verification, the Parquet row, the ledger. CPU is read from
/proc (user+sys, all threads) after a warm-up run, so the seconds spent
importing Celery and starting are not charged to samples.

The same worker then keeps going: its resident memory after k samples and
after 4k samples shows whether it grows with the number of samples (a leak)
or stays flat (only the group-commit buffer, at most one shard of rows).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .lab import Lab
from .procs import cpu_seconds, peak_rss_bytes, rss_bytes
from .prompts import repeated, write_jsonl
from .publish import enqueue

INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0"]


@dataclass
class WorkerOptions:
    samples: int = 1000          # k: CPU per sample is taken over these; RSS after k and after 4k
    warmup: int = 100
    output_len_median: float = 4000
    output_len_sigma: float = 0.01
    output_len_max: int = 4100
    max_new_tokens: int = 8192
    settle_s: float = 1.0        # after the last sample, before reading RSS
    timeout: float = 900.0

    def standin_options(self) -> list[str]:
        return [*INSTANT, "--output-len-median", str(self.output_len_median),
                "--output-len-sigma", str(self.output_len_sigma),
                "--output-len-max", str(self.output_len_max)]


def run_worker_cost(lab: Lab, opts: WorkerOptions, log) -> dict:
    lab.flush()
    k = opts.samples
    # Cumulative samples after each phase: k, 2k, 4k (the warm-up is not counted).
    phases = [("warmup", opts.warmup), ("k", k), ("2k", k), ("4k", 2 * k)]
    files, offset = {}, 0
    for name, count in phases:  # distinct ids across phases, all from the examples
        prompts = [(f"{name}-{pid}", m) for pid, m in repeated(offset + count)[offset:]]
        files[name] = write_jsonl(lab.root / "prompts" / f"worker-{name}-{count}.jsonl", prompts)
        offset += count
    output_dir = lab.output_dir("worker")
    standins = lab.standins(1, opts.standin_options())
    worker = lab.worker("cost", {"SGLANG_URLS": standins[0].url, "OUTPUT_DIR": str(output_dir)})
    watch = [worker, standins[0].process]
    pid, spid = worker.popen.pid, standins[0].process.popen.pid
    readings: dict[str, dict] = {}
    so_far = 0
    try:
        for name, count in phases:
            log(f"worker cost: {name} ({count} samples of ~{opts.output_len_median:.0f} tokens)")
            cpu0, scpu0, rcpu0, t0 = cpu_seconds(pid), cpu_seconds(spid), cpu_seconds(lab.redis_pid), time.monotonic()
            enqueue(files[name], f"wc-{name}", opts.max_new_tokens)
            states = lab.wait_finished(f"wc-{name}", count, opts.timeout, watch, interval=0.1)
            wall = time.monotonic() - t0
            cpu1, scpu1, rcpu1 = cpu_seconds(pid), cpu_seconds(spid), cpu_seconds(lab.redis_pid)
            time.sleep(opts.settle_s)
            so_far += count if name != "warmup" else 0
            readings[name] = {
                "samples": count, "states": states, "wall_s": wall,
                "worker_cpu_s": cpu1 - cpu0, "standin_cpu_s": scpu1 - scpu0, "redis_cpu_s": rcpu1 - rcpu0,
                "worker_cpu_ms_per_sample": (cpu1 - cpu0) / count * 1000,
                "rss_bytes": rss_bytes(pid), "peak_rss_bytes": peak_rss_bytes(pid),
                "samples_so_far": so_far,
            }
    finally:
        lab.stop([worker, standins[0].process])
    tokens = opts.output_len_median
    after_k = [r for n, r in readings.items() if n != "warmup"]
    return {
        "cpu_ms_per_sample": readings["k"]["worker_cpu_ms_per_sample"],
        "cpu_ms_per_sample_after_k": (sum(r["worker_cpu_s"] for r in after_k[1:])
                                      / sum(r["samples"] for r in after_k[1:]) * 1000),
        "output_tokens_per_sample": tokens,
        "rss_after_warmup": readings["warmup"]["rss_bytes"],
        "rss_after_k": readings["k"]["rss_bytes"],
        "rss_after_2k": readings["2k"]["rss_bytes"],
        "rss_after_4k": readings["4k"]["rss_bytes"],
        "rss_ratio": readings["4k"]["rss_bytes"] / readings["k"]["rss_bytes"],
        "k": k,
        "phases": readings,
    }
