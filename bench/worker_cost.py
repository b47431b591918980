"""What one sample costs a worker process: CPU per sample and memory growth.

An instant stand-in (no modelled time) answers ~4,000-token outputs at once,
so the worker, not the server, is the limit, and everything its process
spends is the fleet's own overhead: consuming from Redis, the HTTP call and
JSON decode, verification, the Parquet row, the ledger. CPU is read from
/proc (user+sys, all threads) after a warm-up run, so the seconds spent
importing Celery and starting are not charged to samples.

The same worker then keeps going: its resident memory after m more samples
and after 10m in all shows whether it grows with the number of samples (a
leak) or stays flat (only the group-commit buffer, at most one shard of rows).
`--worker-memory-samples 10000` is the issue's 10,000 vs 100,000 samples.
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
    samples: int = 500           # k: CPU per sample is taken over these
    memory_samples: int = 500    # m: RSS after m more samples, then after 10m in all
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
    k, m = opts.samples, opts.memory_samples
    phases = [("warmup", opts.warmup), ("cost", k), ("m", m), ("10m", 9 * m)]
    files, offset = {}, 0
    for name, count in phases:  # distinct ids across phases, all from the examples
        prompts = [(f"{name}-{pid}", msgs) for pid, msgs in repeated(offset + count)[offset:]]
        files[name] = write_jsonl(lab.root / "prompts" / f"worker-{name}-{count}.jsonl", prompts)
        offset += count
    output_dir = lab.output_dir("worker")
    standins = lab.standins(1, opts.standin_options())
    worker = lab.worker("cost", {"SGLANG_URLS": standins[0].url, "OUTPUT_DIR": str(output_dir)})
    watch = [worker, standins[0].process]
    readings: dict[str, dict] = {}
    try:
        for name, count in phases:
            log(f"worker cost: {name} ({count} samples of ~{opts.output_len_median:.0f} tokens)")
            readings[name] = _phase(lab, worker.popen.pid, standins[0].process.popen.pid, files[name],
                                    f"wc-{name}", count, watch, opts)
    finally:
        lab.stop([worker, standins[0].process])
    return {
        "cpu_ms_per_sample": readings["cost"]["worker_cpu_ms_per_sample"],
        "cpu_ms_per_sample_memory_phases": ((readings["m"]["worker_cpu_s"] + readings["10m"]["worker_cpu_s"])
                                            / (10 * m) * 1000),
        "output_tokens_per_sample": opts.output_len_median,
        "rss_after_warmup": readings["warmup"]["rss_bytes"],
        "rss_after_cost": readings["cost"]["rss_bytes"],
        "rss_after_m": readings["m"]["rss_bytes"],
        "rss_after_10m": readings["10m"]["rss_bytes"],
        "rss_ratio": readings["10m"]["rss_bytes"] / readings["m"]["rss_bytes"],
        "k": k,
        "m": m,
        "phases": readings,
    }


def _phase(lab: Lab, pid: int, standin_pid: int, prompt_file, run: str, count: int, watch,
           opts: WorkerOptions) -> dict:
    """Enqueue one prompt file, wait for the worker to store it all, and read its CPU and RSS."""
    cpu0, scpu0, rcpu0 = cpu_seconds(pid), cpu_seconds(standin_pid), cpu_seconds(lab.redis_pid)
    t0 = time.monotonic()
    enqueue(prompt_file, run, opts.max_new_tokens)
    states = lab.wait_finished(run, count, max(opts.timeout, count * 0.1), watch,
                               interval=0.1 if count < 5000 else 1.0)  # counting a big ledger costs
    wall = time.monotonic() - t0
    cpu1, scpu1, rcpu1 = cpu_seconds(pid), cpu_seconds(standin_pid), cpu_seconds(lab.redis_pid)
    time.sleep(opts.settle_s)
    return {
        "samples": count, "states": states, "wall_s": wall,
        "worker_cpu_s": cpu1 - cpu0, "standin_cpu_s": scpu1 - scpu0, "redis_cpu_s": rcpu1 - rcpu0,
        "worker_cpu_ms_per_sample": (cpu1 - cpu0) / count * 1000,
        "rss_bytes": rss_bytes(pid), "peak_rss_bytes": peak_rss_bytes(pid),
    }
