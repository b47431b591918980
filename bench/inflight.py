"""Worker CPU per sample at 16, 256 and 2,048 requests in flight, beside the ideal client's.

The issue's question: does a sample cost the worker the same CPU whatever the
number of requests it keeps in flight? For each level N, one instant stand-in
(no modelled time, a batch of N, ~100-token answers: the short-output regime,
where the per-request overhead weighs most) serves first the ideal client
(`bench/ideal.py`, N lanes: its CPU per request, in this process), then a
real `celery -A workers worker` with `FLEET_MAX_INFLIGHT_PER_SERVER=N` and
`FLEET_CONCURRENCY=2N` (the default's ratio: threads waiting for their shard's
group commit hold no server slot). After a warm-up run of 2N prompts (imports,
threads, connections), the worker's CPU (user+sys of its process tree, from
/proc) over k = max(`samples`, 4N) more prompts (so that at every level the
queue holds more than the worker's 2N prefetched messages for most of the
run), from the first message published to the last sample durable (done in
the ledger, so its shard is renamed into place and its task acknowledged),
divided by k. The ideal client sends the same k prompts.

Group commit is part of the cost: a shard holds at most the samples waiting
for it, so at 16 in flight (32 threads) shards are small and their fixed cost
weighs more per sample; the figures' notes give the rows per shard.

Ratios printed (same run): worker CPU@max / CPU@min (goal <= 1.2) and, per
level, worker / ideal (goal <= 3). A 2-core machine shared with others is
noisy: the figures are medians over `--inflight-repeat` runs of each level.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .ideal import run_ideal
from .lab import Lab
from .procs import cpu_seconds, thread_count, tree_cpu_seconds
from .prompts import repeated, write_jsonl
from .publish import chat_tokenizer, enqueue, sampling_params
from .saturation import RunningSampler

INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0"]


@dataclass
class InflightOptions:
    levels: tuple[int, ...] = (16, 256, 2048)
    samples: int = 1000          # at least, per level, after the warm-up (4N at N in flight)
    repeat: int = 1
    output_len_median: float = 100
    output_len_max: int = 110
    max_new_tokens: int = 256
    threads_per_slot: int = 2    # FLEET_CONCURRENCY = this x N
    request_seconds: float = 0.0  # 0: instant; else each request lasts about this long on the stand-in
    timeout: float = 900.0

    def standin_options(self, n: int) -> list[str]:
        timing = INSTANT if not self.request_seconds else [
            "--step-base", str(self.request_seconds / self.output_len_median), "--step-per-request", "0",
            "--prefill-per-token", "0"]
        return [*timing, "--max-running-requests", str(n), "--output-len-median", str(self.output_len_median),
                "--output-len-sigma", "0.01", "--output-len-max", str(self.output_len_max)]


def run_inflight(lab: Lab, opts: InflightOptions, log) -> dict:
    chat = chat_tokenizer()
    most = max(opts.samples, 4 * max(opts.levels))
    cost = repeated(most)
    cost_ids = list(zip([i for i, _ in cost], chat.render([m for _, m in cost])))
    runs: dict[int, list[dict]] = {n: [] for n in opts.levels}
    for rep in range(opts.repeat):
        for n in opts.levels:
            k = max(opts.samples, 4 * n)
            cost_file = write_jsonl(lab.root / "prompts" / f"inflight-{k}.jsonl", cost[:k])
            log(f"in flight {n}: ideal client, then a worker ({k} samples, run {rep + 1}/{opts.repeat})")
            runs[n].append(_level(lab, n, cost_file, cost_ids[:k], opts))
            r = runs[n][-1]
            log(f"  worker {r['worker_cpu_us_per_sample']:.0f} us/sample ({r['samples_per_s']:.0f}/s, "
                f"{r['worker_threads']} threads), ideal {r['ideal_cpu_us_per_request']:.0f} us/request")
    levels = {n: _median(found) for n, found in runs.items()}
    lo, hi = min(opts.levels), max(opts.levels)
    return {"levels": levels, "runs": runs, "low": lo, "high": hi,
            "output_len_median": opts.output_len_median,
            "growth": levels[hi]["worker_cpu_us_per_sample"] / levels[lo]["worker_cpu_us_per_sample"]}


def _median(found: list[dict]) -> dict:
    """The run with the (lower) median worker CPU, with every run's figure."""
    ordered = sorted(found, key=lambda r: r["worker_cpu_us_per_sample"])
    pick = dict(ordered[(len(ordered) - 1) // 2])
    pick["worker_cpu_us_all"] = [r["worker_cpu_us_per_sample"] for r in found]
    pick["ideal_cpu_us_all"] = [r["ideal_cpu_us_per_request"] for r in found]
    pick["ideal_cpu_us_median"] = statistics.median(pick["ideal_cpu_us_all"])
    return pick


def _level(lab: Lab, n: int, cost_file, cost_ids, opts: InflightOptions) -> dict:
    lab.flush()
    standin = lab.standins(1, opts.standin_options(n))[0]
    worker = None
    try:
        sampling = sampling_params(opts.max_new_tokens)
        ideal = run_ideal([(standin.url, n)], cost_ids, sampling)
        if ideal.errors:
            raise RuntimeError(f"ideal client: {ideal.errors} requests failed")
        threads = opts.threads_per_slot * n
        k = len(cost_ids)
        warm = repeated(threads + k)[k:]  # ids unlike the cost run's
        warm_file = write_jsonl(lab.root / "prompts" / f"inflight-warm-{threads}.jsonl", warm)
        worker = lab.worker(f"inflight-{n}", {
            "SGLANG_URLS": standin.url, "OUTPUT_DIR": str(lab.output_dir(f"inflight-{n}")),
            "FLEET_MAX_INFLIGHT_PER_SERVER": str(n), "FLEET_CONCURRENCY": str(threads)})
        watch = [worker, standin.process]
        enqueue(warm_file, f"if{n}-warm", opts.max_new_tokens)
        lab.wait_finished(f"if{n}-warm", len(warm), opts.timeout, watch)
        pid = worker.popen.pid
        cpu0, scpu0, t0 = tree_cpu_seconds(pid), cpu_seconds(standin.process.popen.pid), time.monotonic()
        with RunningSampler([standin]) as running:
            enqueue(cost_file, f"if{n}", opts.max_new_tokens)
            states = lab.wait_finished(f"if{n}", k, opts.timeout, watch, interval=0.05)
        cpu1, scpu1, t1 = tree_cpu_seconds(pid), cpu_seconds(standin.process.popen.pid), time.monotonic()
        workers_threads = thread_count(pid)
    finally:
        lab.stop(([worker] if worker else []) + [standin.process])
    shards = [f for f in (lab.output_dir(f"inflight-{n}") / f"if{n}").glob("*.parquet") if not f.name.startswith(".")]
    return {
        "samples": k, "mean_running": running.mean(), "shards": len(shards), "rows_per_shard": k / len(shards) if shards else None,
        "n": n, "threads_setting": threads, "worker_threads": workers_threads, "states": states,
        "worker_cpu_us_per_sample": (cpu1 - cpu0) / k * 1e6, "worker_cpu_s": cpu1 - cpu0,
        "standin_cpu_us_per_sample": (scpu1 - scpu0) / k * 1e6, "wall_s": t1 - t0,
        "samples_per_s": k / (t1 - t0),
        "ideal_cpu_us_per_request": ideal.client_cpu_seconds / ideal.requests * 1e6,
        "ideal_requests": ideal.requests, "ideal_retried": ideal.dropped_connections, "ideal_wall_s": ideal.wall_seconds,
    }


def inflight_figures(d: dict) -> list:
    from .report import Figure, at_most

    part, levels = "7 in flight", d["levels"]
    figures = []
    for n, r in sorted(levels.items()):
        ratio = r["worker_cpu_us_per_sample"] / r["ideal_cpu_us_per_request"]
        figures += [
            Figure(part, f"worker CPU per sample, {n} in flight", r["worker_cpu_us_per_sample"], "{:,.0f}", "us",
                   note=f"{r['samples']} samples of ~{d['output_len_median']:.0f} tokens, {r['samples_per_s']:.0f}/s, "
                        f"{r['worker_threads']} threads, {_num(r['mean_running'])} running on the server "
                        f"(sampled mean), {_num(r['rows_per_shard'])} rows a shard; "
                        f"runs {_list(r['worker_cpu_us_all'])}"),
            Figure(part, f"ideal client CPU per request, {n} in flight", r["ideal_cpu_us_per_request"], "{:,.0f}",
                   "us", note=f"same stand-in, {r['ideal_requests']} requests ({r['ideal_retried']} resent after a "
                        f"refused connection); runs {_list(r['ideal_cpu_us_all'])}"),
            Figure(part, f"worker / ideal, {n} in flight", ratio, "{:.2f}", goal="<= 3", met=at_most(ratio, 3.0)),
        ]
    figures.append(Figure(part, f"worker CPU@{d['high']} / CPU@{d['low']}", d["growth"], "{:.2f}",
                          goal="<= 1.2", met=at_most(d["growth"], 1.2),
                          note="per sample, message to durable acknowledged sample"))
    return figures


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)
