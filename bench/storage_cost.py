"""What object storage costs: shard commits and worker CPU with OUTPUT_DIR on S3 vs a local folder.

One worker, one instant stand-in and the same prompts twice in one bench run:
first with `OUTPUT_DIR` a local folder, then `s3://bench/runs` on moto's S3
server (a separate process on loopback, `producer/local_s3.py`). From the
worker's own metrics (`fleet_shard_commit_seconds`, `fleet_shard_rows_total`)
come the commits, their mean time and the bytes per second they carry; from
/proc the worker's CPU per sample (user+sys, after a warm-up) and the S3
server's. The ratio S3 / local is what a user pays for a bucket; what decides
it is the object's size: a commit costs one PUT whatever its size, so the
bigger the shard (`FLEET_SHARD_MAX_ROWS`, the rate), the less it costs per
sample. moto is a Python server, slower than S3 or MinIO, so the commit time
on it is an upper bound for a nearby store.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from producer.local import free_port
from producer.local_s3 import BUCKET, start_s3

from .lab import Lab
from .procs import cpu_seconds
from .prompts import repeated, write_jsonl
from .publish import enqueue
from .worker_cost import INSTANT


@dataclass
class StorageOptions:
    samples: int = 1000
    warmup: int = 100
    output_len: int = 1000
    max_rows: int = 100          # FLEET_SHARD_MAX_ROWS: the object's size in samples
    max_new_tokens: int = 4096
    timeout: float = 600.0


def run_storage_cost(lab: Lab, opts: StorageOptions, log) -> dict:
    s3 = start_s3(lab.logs)
    try:
        sides = {}
        folder = lab.output_dir("storage-local")
        for side, output in (("local", str(folder)), ("s3", f"s3://{BUCKET}/runs")):
            log(f"storage cost: {side} ({opts.samples} samples, shards of up to {opts.max_rows} rows)")
            sides[side] = _side(lab, opts, side, {"OUTPUT_DIR": output, **s3.env}, s3.process.popen.pid)
        sides["local"]["bytes"] = sum(p.stat().st_size for p in (folder / "st-local-cost").glob("part-*.parquet"))
        pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="runs/st-s3-cost/")
        sides["s3"]["bytes"] = sum(o["Size"] for page in pages for o in page.get("Contents", ()))
        for side in sides.values():
            side["bytes_per_commit"] = side["bytes"] / max(1, side["commits"])
            side["mb_per_s"] = side["bytes"] / 1e6 / (side["commit_ms"] * side["commits"] / 1000)
    finally:
        s3.stop()
    local, remote = sides["local"], sides["s3"]
    return {**sides, "cpu_ratio": remote["cpu_ms_per_sample"] / local["cpu_ms_per_sample"],
            "commit_ratio": remote["commit_ms"] / local["commit_ms"], "max_rows": opts.max_rows,
            "samples": opts.samples, "output_len": opts.output_len}


def _side(lab: Lab, opts: StorageOptions, side: str, env: dict, s3_pid: int) -> dict:
    lab.flush()
    port = free_port()
    standin = lab.standins(1, [*INSTANT, "--output-len-median", str(opts.output_len), "--output-len-sigma", "0.01",
                               "--output-len-max", str(int(opts.output_len * 1.05))])[0]
    worker = lab.worker(f"storage-{side}", {"SGLANG_URLS": standin.url, "FLEET_METRICS_PORT": str(port),
                                            "FLEET_SHARD_MAX_ROWS": str(opts.max_rows), **env})
    watch = [worker, standin.process]
    try:
        readings = []
        for phase, count, offset in (("warmup", opts.warmup, 0), ("cost", opts.samples, opts.warmup)):
            prompts = [(f"{phase}-{pid}", msgs) for pid, msgs in repeated(offset + count)[offset:]]
            path = write_jsonl(lab.root / "prompts" / f"storage-{side}-{phase}.jsonl", prompts)
            enqueue(path, f"st-{side}-{phase}", opts.max_new_tokens)
            lab.wait_finished(f"st-{side}-{phase}", count, opts.timeout, watch, interval=0.1)
            readings.append(_readings(worker.popen.pid, s3_pid, port))  # after the warm-up, after the cost
        before, after = readings
    finally:
        lab.stop(watch)
    commits = after["commits"] - before["commits"]
    seconds = after["commit_s"] - before["commit_s"]
    return {"samples": opts.samples, "commits": commits, "rows_per_commit": opts.samples / max(1, commits),
            "commit_ms": seconds / max(1, commits) * 1000,
            "commits_per_s": commits / seconds if seconds else None,
            "cpu_ms_per_sample": (after["cpu_s"] - before["cpu_s"]) / opts.samples * 1000,
            "s3_server_cpu_ms_per_sample": (after["s3_cpu_s"] - before["s3_cpu_s"]) / opts.samples * 1000}


def _readings(pid: int, s3_pid: int, port: int) -> dict:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
              if s.name in ("fleet_shard_commits_total", "fleet_shard_commit_seconds_sum")}
    return {"commits": values.get("fleet_shard_commits_total", 0.0),
            "commit_s": values.get("fleet_shard_commit_seconds_sum", 0.0),
            "cpu_s": cpu_seconds(pid), "s3_cpu_s": cpu_seconds(s3_pid), "at": time.monotonic()}
