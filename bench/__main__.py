"""`python -m bench`: the fleet's figures, measured against real processes.

Parts (each can be chosen with --parts, each sized by its flags):
  saturation       fleet vs ideal client, server-side tokens/s, and the tail
  producer         enqueue prompts/s vs tokenizer-only prompts/s, servers one producer feeds
  worker           worker CPU ms per sample, and worker RSS after m and 10m samples
  redis            Redis bytes per queued prompt token
  producer-memory  producer peak RSS for n and 4n input lines
  scale            per-run costs at 10^4..10^6 prompts, and a real run's first vs last tenth
                   (not in the default set: about 15 minutes here; --parts scale)
  inflight         worker CPU per sample at 16, 256 and 2,048 requests in flight, beside the
                   ideal client's CPU per request (not in the default set: --parts inflight)
  storage          shard commit time and worker CPU per sample with OUTPUT_DIR on an S3 server
                   (moto, a separate process) vs a local folder, same run
  cache            prefix-cache hit share and throughput of the fleet (affinity on and off)
                   against an oracle client, on conversations and shared system prompts, and
                   with --cache-workloads samples on several samples a prompt (enqueue --samples)
                   (not in the default set: --parts cache)
  sample           Redis commands, Redis CPU and worker CPU per stored sample, one worker on a
                   batch-256 stand-in with short answers (not in the default set: --parts sample)
  fleet            Redis CPU per sample (simulated nodes at 2 samples/s each, and one real worker)
                   and per worker-second, round trips, commands, connections, the audit's rounds
                   and the longest command at 10, 100 and 1,000 simulated workers, Redis pinned to
                   a core of its own; projected to 100, 1,000 and 5,000 nodes (not in the default
                   set: --parts fleet)
  http             CPU per /generate request of the worker's call and of its answer parser's
                   candidates, llhttp (httptools) and h11, at 16 and 256 in flight against an
                   instant stand-in (not in the default set: --parts http; about 2 minutes)

Defaults are sized to finish in about fifteen minutes on a 2-core machine; every
goal is a ratio or a size measured within the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from .report import Figure, at_least, at_most, print_table, write_json

PARTS = ("saturation", "producer", "worker", "redis", "producer-memory", "scale", "inflight", "storage", "cache",
         "sample", "fleet", "http")
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ("scale", "inflight", "cache", "sample", "fleet", "http"))
MiB = 1024 * 1024
MEMORY_SCALE = 10_000  # worker RSS: after 10,000 and after 100,000 samples, as the issue sets it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--json", type=Path, help="also write every figure and its details here")
    p.add_argument("--workdir", type=Path, help="logs, prompt files and shards (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (always kept after a failure)")
    s = p.add_argument_group("saturation")
    s.add_argument("--prompts", type=int, help="N prompts per side (default: --prompts-per-slot x servers x batch)")
    s.add_argument("--prompts-per-slot", type=float, default=None,
                   help="prompts per batch slot, so every topology runs the same number of batches "
                        "(default: 5 for long answers, 30 for short ones)")
    s.add_argument("--topologies", default=None,
                   help="comma-separated; SERVERSxBATCH or BATCH+BATCH+..., then :short for ~100-token answers "
                        "(default: 2x64,1x256,1x64:short,1x256:short,1x256:short/w2,64+256:short,1x64/w3,"
                        "gw:2x64/w4); /wN: N worker processes share the servers; gw: through one gateway")
    s.add_argument("--max-new-tokens", type=int, default=8192)
    s.add_argument("--output-len-median", type=float, default=600, help="long answers (short: 100)")
    s.add_argument("--output-len-sigma", type=float, default=0.7, help="long answers (short: 0.3)")
    s.add_argument("--output-len-max", type=int, default=4000, help="long answers (short: 300)")
    s.add_argument("--step-base", type=float, default=0.004)
    s.add_argument("--step-per-request", type=float, default=0.00002)
    s.add_argument("--fleet-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra worker environment for the fleet side, e.g. FLEET_CONCURRENCY=256")
    s.add_argument("--fleet-workers", type=int, default=1,
                   help="worker processes on the fleet side, each bound to every server (default 1)")
    s.add_argument("--ratio-goal", type=float, default=0.97)
    g = p.add_argument_group("producer speed")
    g.add_argument("--producer-prompts", type=int, default=5000)
    g.add_argument("--producer-prompt-tokens", type=int, default=300)
    g.add_argument("--producer-reps", type=int, default=2)
    g.add_argument("--server-prompts-per-s", type=float, default=2.0,
                   help="prompts/s one SGLang server completes, for 'servers one producer feeds' "
                        "(2.0: batch 64, ~5,000 tokens/s, ~2,500-token outputs)")
    w = p.add_argument_group("worker cost and memory")
    w.add_argument("--worker-samples", type=int, default=500, help="k: CPU per sample over k samples")
    w.add_argument("--worker-memory-samples", type=int, default=500,
                   help="m: RSS after m more samples and after 10m (10000: the 10,000 vs 100,000 check)")
    w.add_argument("--worker-warmup", type=int, default=100)
    w.add_argument("--worker-output-len", type=float, default=4000)
    r = p.add_argument_group("redis memory")
    r.add_argument("--redis-prompts", type=int, default=5000)
    r.add_argument("--redis-prompt-tokens", type=int, default=300)
    m = p.add_argument_group("producer memory")
    m.add_argument("--producer-lines", type=int, default=2000, help="n: peak RSS for n and 4n lines")
    f = p.add_argument_group("requests in flight")
    f.add_argument("--inflight-levels", default="16,256,2048", help="requests in flight, comma-separated")
    f.add_argument("--inflight-samples", type=int, default=1000, help="samples per level at least (4N at N in flight), after a warm-up")
    f.add_argument("--inflight-repeat", type=int, default=1, help="runs per level; the median is shown")
    f.add_argument("--inflight-output-len", type=float, default=100, help="output tokens per answer")
    f.add_argument("--inflight-request-seconds", type=float, default=0.0,
                   help="0: an instant stand-in; else each request lasts about this long (more really in flight)")
    o = p.add_argument_group("object storage")
    o.add_argument("--storage-samples", type=int, default=1000, help="samples per side, after a warm-up")
    o.add_argument("--storage-max-rows", type=int, default=100, help="FLEET_SHARD_MAX_ROWS on both sides")
    o.add_argument("--storage-output-len", type=int, default=1000, help="output tokens per sample")
    c = p.add_argument_group("scale")
    c.add_argument("--scale-sizes", default="10000,100000,1000000", help="run sizes, comma-separated")
    c.add_argument("--scale-real-prompts", type=int, default=10_000,
                   help="prompts of the real run through producer, Redis and a worker (0: none; 100000: the issue's)")
    c.add_argument("--scale-row-tokens", type=int, default=256, help="tokens per exported row")
    c.add_argument("--scale-skip", default="", help="comma-separated: export, worst-case, producer")
    k = p.add_argument_group("prefix cache")
    k.add_argument("--cache-workloads", default="conversations,shared",
                   help="conversations, shared, samples (several samples a prompt), comma-separated")
    k.add_argument("--cache-samples", type=int, default=4, help="samples a prompt (the samples workload)")
    k.add_argument("--cache-sampled-prompts", type=int, default=320, help="distinct prompts (the samples workload)")
    k.add_argument("--cache-conversations", type=int, default=480, help="conversations of 3-6 turns")
    k.add_argument("--cache-shared-prompts", type=int, default=1280, help="prompts under 8 shared system prompts")
    k.add_argument("--cache-batch", type=int, default=16, help="batch of each of the 4 stand-ins")
    k.add_argument("--cache-prefill-per-token", type=float, default=0.00001,
                   help="seconds per uncached prompt token (a 1,500-token prefill: about 2 decode steps)")
    q = p.add_argument_group("cost per sample")
    q.add_argument("--sample-prompts", type=int, default=6000, help="prompts queued before the worker starts")
    q.add_argument("--sample-warmup", type=int, default=1500, help="samples stored before the window opens")
    q.add_argument("--sample-tail", type=int, default=1000, help="samples still queued when it closes")
    z = p.add_argument_group("fleet size")
    z.add_argument("--fleet-sizes", default="10,100,1000", help="simulated workers, comma-separated")
    z.add_argument("--fleet-samples", type=int, default=1000, help="samples the real worker stores per size")
    z.add_argument("--fleet-node-clients", default="2x16", metavar="PxT",
                   help="client processes x driven nodes per process for the node-rate samples (default 2x16)")
    from .http_cpu import add_arguments as http_arguments

    http_arguments(p.add_argument_group("http"))
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown part(s) {sorted(unknown)}")
    return args


def _env_pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--fleet-env wants KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _per_server(r: dict) -> str:
    """Each server's own fleet / ideal tokens/s, by batch: whether one of them was starved."""
    pairs = zip(r["topology"]["batches"], r["fleet"]["throughput"]["servers"], r["ideal"]["throughput"]["servers"])
    parts = [f"batch {b}: {f['tokens_per_s'] / i['tokens_per_s']:.2f}" for b, f, i in pairs if i["tokens_per_s"]]
    return "per server " + ", ".join(parts) if len(parts) > 1 else ""


def saturation_figures(results: list[dict], goal: float) -> list[Figure]:
    from .shared_server import sharing_figures

    figures = []
    for r in results:
        part, i, f = f"1 saturation {r['topology']['name']}", r["ideal"], r["fleet"]
        same = "" if r["same_tokens"] else " (token totals differ!)"
        figures += [
            Figure(part, "ideal client, server tokens/s", i["throughput"]["tokens_per_s"], "{:,.0f}",
                   note=f"{r['prompts']} prompts, {i['throughput']['tokens']:,} tokens{same}"),
            Figure(part, "fleet, server tokens/s", f["throughput"]["tokens_per_s"], "{:,.0f}",
                   note="sum over servers of tokens / (last_end - first_start)"),
            Figure(part, "ratio fleet / ideal", r["ratio"], "{:.3f}", goal=f">= {goal}",
                   met=at_least(r["ratio"], goal), note=_per_server(r)),
            Figure(part, "tail: last token -> last shard durable", f["tail_s"], "{:.2f}", "s",
                   note="includes up to FLEET_SHARD_MAX_WAIT of group commit"),
            Figure(part, "worker CPU in window", f["worker_cpu_s_window"], "{:.1f}", "s",
                   note=(f"{f.get('workers', 1)} worker process(es), over {f['window_s']:.1f} s; stand-ins {f['standin_cpu_s_window']:.1f} s, "
                         f"redis {f['redis_cpu_s_window']:.1f} s, ideal client {i['client_cpu_s']:.1f} s; "
                         f"2 cores shared")),
            Figure(part, "requests running, fleet (sampled mean)", f["mean_running_sampled"], "{:.0f}",
                   note=f"ideal client {_num(i['mean_running_sampled'])}; batch slots "
                        f"{r['topology']['slots']}; 4/s, drain included"),
        ]
        figures += sharing_figures(r, part, goal)
    return figures


def producer_figures(d: dict, server_rate: float) -> list[Figure]:
    part, long, short = "2 producer speed", d["long"], d["short"]
    return [
        Figure(part, "tokenizer only (render), prompts/s", long["tokenize_prompts_per_s"], "{:,.0f}",
               note=f"{long['prompts']} prompts, {long['mean_prompt_tokens']:.0f} tokens each, "
                    f"batches of {long['batch']}"),
        Figure(part, "enqueue_file to Redis, prompts/s", long["enqueue_prompts_per_s"], "{:,.0f}",
               note=f"{long['enqueue_cpu_us_per_prompt']:.0f} us CPU per prompt"),
        Figure(part, "ratio enqueue / tokenizer", long["ratio"], "{:.2f}", goal=">= 0.7",
               met=at_least(long["ratio"], 0.7), note=f"median of {len(long['reps'])} alternating reps"),
        Figure(part, "same, short prompts", short["ratio"], "{:.2f}",
               note=f"{short['mean_prompt_tokens']:.0f} tokens: tokenizer {short['tokenize_prompts_per_s']:,.0f}/s, "
                    f"enqueue {short['enqueue_prompts_per_s']:,.0f}/s, "
                    f"{short['enqueue_cpu_us_per_prompt']:.0f} us CPU per prompt"),
        Figure(part, "servers one producer feeds", long["enqueue_prompts_per_s"] / server_rate, "{:,.0f}",
               goal=">= 100", met=at_least(long["enqueue_prompts_per_s"] / server_rate, 100),
               note=f"at {server_rate:g} prompts/s per server (--server-prompts-per-s)"),
    ]


def worker_figures(d: dict) -> list[Figure]:
    m = d["m"]
    judged = m >= MEMORY_SCALE  # below it, the first samples' warm-up (thread stacks, arenas) dominates
    return [
        Figure("3 worker cost", "worker CPU per sample", d["cpu_ms_per_sample"], "{:.1f}", "ms",
               note=f"over {d['k']} samples of ~{d['output_tokens_per_sample']:.0f} tokens, instant "
                    f"stand-in; over the next {10 * m}: {d['cpu_ms_per_sample_memory_phases']:.1f} ms"),
        Figure("5 memory", f"worker RSS after {10 * m:,} / after {m:,} samples",
               d["rss_ratio"], "{:.3f}", goal="<= 1.10 (flat)" if judged else "",
               met=at_most(d["rss_ratio"], 1.10) if judged else None,
               note=f"RSS after the warm-up, the {d['k']} cost samples, then {m:,} and {10 * m:,} samples: "
                    f"{d['rss_after_warmup'] / MiB:.0f} / "
                    f"{d['rss_after_cost'] / MiB:.0f} / {d['rss_after_m'] / MiB:.0f} / "
                    f"{d['rss_after_10m'] / MiB:.0f} MiB"
                    + ("" if judged else f"; the goal is judged at the issue's scale, "
                                         f"--worker-memory-samples {MEMORY_SCALE} (17 minutes here)")),
    ]


def storage_figures(d: dict) -> list[Figure]:
    part, local, s3 = "8 object storage", d["local"], d["s3"]
    shape = f"{d['samples']} samples of ~{d['output_len']} tokens, FLEET_SHARD_MAX_ROWS {d['max_rows']}"
    return [
        Figure(part, "shard commit, S3 / local (mean time)", d["commit_ratio"], "{:.2f}",
               note=f"{s3['commit_ms']:.0f} ms vs {local['commit_ms']:.0f} ms per shard of "
                    f"{s3['rows_per_commit']:.0f} rows, {s3['bytes_per_commit'] / 1e6:.2f} MB "
                    f"({s3['mb_per_s']:.1f} vs {local['mb_per_s']:.1f} MB/s committed, {s3['commits']:.0f} / "
                    f"{local['commits']:.0f} commits); {shape}"),
        Figure(part, "worker CPU per sample, S3 / local", d["cpu_ratio"], "{:.2f}",
               note=f"{s3['cpu_ms_per_sample']:.1f} ms vs {local['cpu_ms_per_sample']:.1f} ms; the S3 server "
                    f"(moto) spent {s3['s3_server_cpu_ms_per_sample']:.1f} ms per sample besides"),
    ]


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # so the Lab stops every process it started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    console = Console(width=None if sys.stdout.isatty() else 150)  # a log file gets the full table
    log = lambda message: console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")  # noqa: E731
    root = args.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    root = root.resolve()
    from .lab import Lab  # after parsing: --help stays instant

    started = time.monotonic()
    figures: list[Figure] = []
    details: dict = {}
    ok = False
    try:
        with Lab(root) as lab:
            log(f"work folder {root}; redis {lab.redis_url}")
            if "saturation" in args.parts:
                from .saturation import (DEFAULT_TOPOLOGIES, PROFILES, Profile, SatOptions, Topology,
                                         run_saturation)

                topologies = [Topology.parse(t) for t in (args.topologies or DEFAULT_TOPOLOGIES).split(",")]
                long = Profile(args.output_len_median, args.output_len_sigma, args.output_len_max,
                               PROFILES["long"].prompts_per_slot)
                opts = SatOptions(prompts=args.prompts, prompts_per_slot=args.prompts_per_slot,
                                  max_new_tokens=args.max_new_tokens, step_base=args.step_base,
                                  step_per_request=args.step_per_request, topologies=topologies,
                                  profiles={**PROFILES, "long": long}, fleet_env=_env_pairs(args.fleet_env),
                                  workers=args.fleet_workers)
                details["saturation"] = run_saturation(lab, opts, log)
                figures += saturation_figures(details["saturation"], args.ratio_goal)
            if "producer" in args.parts:
                from .producer_speed import ProducerOptions, run_producer_speed

                d = details["producer"] = run_producer_speed(lab, ProducerOptions(
                    prompts=args.producer_prompts, prompt_tokens=args.producer_prompt_tokens,
                    reps=args.producer_reps), log)
                figures += producer_figures(d, args.server_prompts_per_s)
            if "worker" in args.parts:
                from .worker_cost import WorkerOptions, run_worker_cost

                d = details["worker"] = run_worker_cost(lab, WorkerOptions(
                    samples=args.worker_samples, memory_samples=args.worker_memory_samples,
                    warmup=args.worker_warmup, output_len_median=args.worker_output_len,
                    output_len_max=int(args.worker_output_len * 1.025)), log)
                figures += worker_figures(d)
            if "redis" in args.parts:
                from .redis_memory import RedisOptions, run_redis_memory

                d = details["redis"] = run_redis_memory(lab, RedisOptions(
                    prompts=args.redis_prompts, prompt_tokens=args.redis_prompt_tokens), log)
                parts = ", ".join(f"{k} {v:.0f}" for k, v in d["key_bytes_per_prompt"].items())
                figures.append(Figure(
                    "4 redis memory", "bytes per queued prompt token", d["bytes_per_token"], "{:.2f}", "B",
                    goal="<= 7", met=at_most(d["bytes_per_token"], 7.0),
                    note=f"{d['prompts']} prompts x {d['mean_prompt_tokens']:.0f} tokens; per prompt "
                         f"{d['bytes_per_prompt']:.0f} B ({parts}, other {d['other_bytes_per_prompt']:.0f})"))
            if "producer-memory" in args.parts:
                from .producer_memory import ProducerMemoryOptions, run_producer_memory

                d = details["producer_memory"] = run_producer_memory(
                    lab, ProducerMemoryOptions(lines=args.producer_lines), log)
                n = d["n"]
                figures.append(Figure(
                    "5 memory", f"producer peak RSS {4 * n} / {n} lines", d["ratio"], "{:.3f}",
                    goal="<= 1.10 (flat)", met=at_most(d["ratio"], 1.10),
                    note=f"{d['runs']['n']['peak_rss_bytes'] / MiB:.0f} MiB -> "
                         f"{d['runs']['4n']['peak_rss_bytes'] / MiB:.0f} MiB (python -m producer enqueue)"))
            if "inflight" in args.parts:
                from .inflight import InflightOptions, inflight_figures, run_inflight

                d = details["inflight"] = run_inflight(lab, InflightOptions(
                    levels=tuple(int(x) for x in args.inflight_levels.split(",")),
                    samples=args.inflight_samples, repeat=args.inflight_repeat,
                    output_len_median=args.inflight_output_len,
                    output_len_max=int(args.inflight_output_len * 1.1),
                    request_seconds=args.inflight_request_seconds), log)
                figures += inflight_figures(d)
            if "storage" in args.parts:
                from .storage_cost import StorageOptions, run_storage_cost

                d = details["storage"] = run_storage_cost(lab, StorageOptions(
                    samples=args.storage_samples, max_rows=args.storage_max_rows,
                    output_len=args.storage_output_len), log)
                figures += storage_figures(d)
            if "cache" in args.parts:
                from .cache import CacheOptions, cache_figures, run_cache

                details["cache"] = run_cache(lab, CacheOptions(
                    workloads=tuple(w.strip() for w in args.cache_workloads.split(",") if w.strip()),
                    conversations=args.cache_conversations, shared_prompts=args.cache_shared_prompts,
                    samples=args.cache_samples, sampled_prompts=args.cache_sampled_prompts,
                    batch=args.cache_batch, prefill_per_token=args.cache_prefill_per_token,
                    fleet_env=_env_pairs(args.fleet_env)), log)
                figures += cache_figures(details["cache"], hit_goal=0.9, speed_goal=args.ratio_goal)
            if "sample" in args.parts:
                from .sample_cost import SampleOptions, run_sample_cost, sample_figures

                details["sample"] = run_sample_cost(lab, SampleOptions(
                    prompts=args.sample_prompts, warmup=args.sample_warmup, tail=args.sample_tail), log)
                figures += sample_figures(details["sample"])
            if "fleet" in args.parts:
                from .fleet_figures import fleet_figures
                from .fleet_size import FleetOptions, run_fleet_size

                processes, threads = (int(x) for x in args.fleet_node_clients.lower().split("x"))
                details["fleet"] = run_fleet_size(lab, FleetOptions(
                    workers=[int(x) for x in args.fleet_sizes.split(",")], samples=args.fleet_samples,
                    node_processes=processes, node_threads=threads), log)
                figures += fleet_figures(details["fleet"])
            if "http" in args.parts:
                from .http_cpu import HttpOptions, http_figures, run_http

                details["http"] = run_http(HttpOptions(
                    threads=tuple(int(x) for x in args.http_threads.split(",")), requests=args.http_requests,
                    repeat=args.http_repeat), log)
                figures += http_figures(details["http"])
            if "scale" in args.parts:
                from .scale import ScaleOptions, run_scale
                from .scale_figures import real_run_figures, scale_figures
                from .scale_run import RealRunOptions, run_real

                skip = set(args.scale_skip.split(","))
                d = details["scale"] = run_scale(lab, ScaleOptions(
                    sizes=[int(x) for x in args.scale_sizes.split(",")], row_tokens=args.scale_row_tokens,
                    export="export" not in skip, export_worst_case="worst-case" not in skip,
                    producer="producer" not in skip), log)
                figures += scale_figures(d)
                if args.scale_real_prompts:
                    d = details["scale_real_run"] = run_real(lab, RealRunOptions(args.scale_real_prompts), log)
                    figures += real_run_figures(d)
        ok = True
    finally:
        seconds = time.monotonic() - started
        if figures:
            print_table(figures, console, f"fleet bench ({seconds:.0f} s, {os.cpu_count()} cores)")
        if args.json:
            meta = {"argv": sys.argv, "seconds": seconds, "cpus": os.cpu_count(), "workdir": str(root),
                    "complete": ok, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            write_json(args.json, figures, details, meta)
            console.print(f"figures written to {args.json}")
        if ok and not args.keep and not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok:
            console.print(f"[red]failed[/red]; logs kept in {root / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
