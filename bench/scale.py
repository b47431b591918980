"""Scale: each per-run cost measured at several run sizes (10^4, 10^5, 10^6 prompts).

For each size n, in a flushed Redis:
- **fill**: n prompts enqueued and marked done in pipelined batches through the
  ledger's own transitions (`Ledger.enqueue`, `Ledger.mark_done`: the scripts the
  producer and the workers run), each naming a shard of `shard_rows` rows.
- **Redis bytes per finished prompt**: growth of INFO `used_memory` over the
  fill, divided by n (the token ids are gone once a prompt is done: what stays
  is its state).
- then 1% more prompts are dead-lettered (`DeadLetters.put`, the workers' bury),
  and **status** (`collect_status`, what `python -m producer status` prints) and
  **dead stats** are timed in this process (median of `status_calls`), with the
  Redis commands each sends (INFO commandstats).
- **export**: shards holding the n done rows (plus a redelivered copy of one
  shard) are written in the shard schema; `python -m producer export` runs as a
  child with `--jobs 1` (its peak RSS, from wait4, and rows/s), with its default
  jobs (a process per GiB of shards), with one job per core, and with one job
  per core and `--rows-per-file` below the
  shards' size (the worst case: every shard read row by row, every id looked
  up, every row rewritten), each against a child reading the same shards with
  `pyarrow.dataset` alone (every column, its default threads).
- **producer**: `python -m producer enqueue` of an n-line file as a child,
  `--max-queued 0` (no worker runs), its peak RSS.

Peak RSS is the child's own VmHWM, read every 50 ms while it runs: `wait4`'s
`ru_maxrss` would also count the RSS the child had before its exec, which is
the bench's own (large once it has written 10^6 rows of shards).

The figures compare each cost across sizes: flat means the largest size costs
what the smallest does (per prompt for bytes, per call for latency, in total
for RSS).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .lab import ROOT, Lab
from .procs import run_measured
from .prompts import repeated, write_jsonl


@dataclass
class ScaleOptions:
    sizes: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    status_calls: int = 30
    shard_rows: int = 1000
    row_tokens: int = 256        # tokens per exported row (prompt + output)
    export: bool = True
    export_worst_case: bool = True  # also export with every shard rewritten row by row
    producer: bool = True
    timeout: float = 1800.0


def run_scale(lab: Lab, opts: ScaleOptions, log) -> dict:
    results = {}
    for n in opts.sizes:
        lab.flush()
        run = f"scale-{n}"
        spec = _save_spec(lab, run)
        log(f"scale {n:,}: filling the ledger through Ledger.enqueue / mark_done")
        d = results[n] = {"prompts": n, **_fill(lab, run, n, opts.shard_rows)}
        d["dead_letters"] = _bury(lab, run, max(10, n // 100))
        d.update(_latencies(lab, spec, opts.status_calls))
        log(f"scale {n:,}: {d['bytes_per_finished']:.1f} B per finished prompt; status "
            f"{d['status_ms']:.2f} ms, dead stats {d['dead_stats_ms']:.2f} ms")
        if opts.export:
            d["export"] = _export(lab, run, n, opts, log)
        if opts.producer:
            lab.flush()
            d["producer"] = _producer(lab, n, opts, log)
        lab.flush()
    return {"sizes": opts.sizes, "results": results}


def _save_spec(lab: Lab, run: str):
    from contract.run.spec import RunSpec, save_spec

    spec = RunSpec(name=run, tokenizer="bench", tokenizer_fingerprint="bench", template_fingerprint="bench",
                   sampling={"max_new_tokens": 64}, thinking="prompt", think_start_id=1, think_end_id=2,
                   stop_ids=[3])
    save_spec(lab.client, spec)
    return spec


def shard_name(index: int) -> str:
    return f"part-{index:07d}.parquet"


def prompt_ids(start: int, stop: int) -> list[str]:
    return [f"prompt-{i:09d}" for i in range(start, stop)]


def _fill(lab: Lab, run: str, n: int, shard_rows: int, batch: int = 2000) -> dict:
    from contract.ledger.codec import pack_ids
    from contract.keys import RunKeys
    from contract.ledger.ledger import Ledger

    client, ledger = lab.client, Ledger(lab.client, run)
    payload = pack_ids(list(range(100, 400)))  # 300 prompt tokens, dropped once done
    before = int(client.info("memory")["used_memory"])
    started = time.monotonic()
    for start in range(0, n, batch):
        pids = prompt_ids(start, min(n, start + batch))
        with client.pipeline(transaction=False) as pipe:
            ledger.enqueue([(p, payload) for p in pids], "bench", pipe)
            for i, pid in enumerate(pids, start=start):
                ledger.mark_done(pid, 100, shard_name(i // shard_rows), pipe)
            pipe.execute()
    seconds = time.monotonic() - started
    after = int(client.info("memory")["used_memory"])
    keys = RunKeys(run)
    buckets = list(client.scan_iter(match=keys.state_prefix + "*", count=5000))
    encodings = Counter(client.object("encoding", b).decode() for b in buckets[::max(1, len(buckets) // 500)])
    return {"fill_s": seconds, "used_memory_growth": after - before, "bytes_per_finished": (after - before) / n,
            "state_buckets": len(buckets), "bucket_encodings_sampled": dict(encodings),
            "ids_hash_len": int(client.hlen(keys.token_ids)), "tally": ledger.tally().by_state()}


def _bury(lab: Lab, run: str, count: int) -> int:
    from contract.ledger.codec import ids_to_b64, pack_ids
    from contract.ledger.deadletters import DeadLetter, DeadLetters
    from contract.ledger.ledger import Ledger

    pids = [f"dead-{i:09d}" for i in range(count)]
    Ledger(lab.client, run).enqueue({p: pack_ids([5, 6, 7]) for p in pids}, "bench")
    store = DeadLetters(lab.client, run)
    for i, pid in enumerate(pids):
        store.put(DeadLetter(id=pid, run=run, reason=("truncated", "aborted", "missing_think_end")[i % 3],
                             message="bench", attempts=1, servers=[], worker="bench",
                             prompt_b64=ids_to_b64([5, 6, 7]), prompt_tokens=3, sampling={}))
    return count


def _latencies(lab: Lab, spec, calls: int) -> dict:
    from contract.ledger.deadletters import DeadLetters
    from contract.settings import SharedSettings
    from producer.status import collect_status

    prefix = SharedSettings().queue_prefix
    out = {}
    for name, call in (("status", lambda: collect_status(lab.client, spec, prefix)),
                       ("dead_stats", lambda: DeadLetters(lab.client, spec.name).stats())):
        call()  # scripts loaded, connection open
        before, times = _commands(lab), []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        sent = _commands(lab) - before - Counter(info=1)
        out[f"{name}_ms"] = statistics.median(times) * 1000
        out[f"{name}_commands"] = {k: v / calls for k, v in sorted(sent.items())}
    return out


def _commands(lab: Lab) -> Counter:
    stats = lab.client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def write_shards(folder: Path, run: str, n: int, shard_rows: int, row_tokens: int) -> list[Path]:
    """n rows in the shard schema, `shard_rows` a shard, ids and shard names as `_fill` marked them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from contract.storage.schema import arrow_schema

    schema, rng = arrow_schema(), np.random.default_rng(7)
    now = pa.scalar(datetime.now(timezone.utc), pa.timestamp("ms", tz="UTC"))
    constants = {"prompt_len": 64, "output_len": row_tokens - 64, "finish_reason": "stop", "stop_token": 3,
                 "think_end_index": 100, "run": run, "server": "http://standin", "model": "bench",
                 "max_new_tokens": 8192, "temperature": 0.6, "top_p": 0.95, "attempts": 1, "worker": "bench",
                 "tokenizer_fingerprint": "bench", "template_fingerprint": "bench", "e2e_latency": 1.0}
    (folder / run).mkdir(parents=True, exist_ok=True)
    paths = []
    for index, start in enumerate(range(0, n, shard_rows)):
        rows = min(shard_rows, n - start)
        values = pa.array(rng.integers(0, 129_280, rows * row_tokens, dtype=np.int32))
        offsets = pa.array(np.arange(0, (rows + 1) * row_tokens, row_tokens, dtype=np.int32))
        columns = {"id": pa.array(prompt_ids(start, start + rows)),
                   "input_ids": pa.ListArray.from_arrays(offsets, values),
                   "started_at": pa.repeat(now, rows), "finished_at": pa.repeat(now, rows)}
        columns |= {k: pa.repeat(pa.scalar(v, schema.field(k).type), rows) for k, v in constants.items()}
        table = pa.table([columns[f.name] for f in schema], schema=schema)
        path = folder / run / shard_name(index)
        pq.write_table(table, path, compression="zstd")
        paths.append(path)
    copy = folder / run / "part-zz-redelivered.parquet"  # a shard stored twice: its rows are not canonical
    copy.write_bytes(paths[0].read_bytes())
    return paths + [copy]


READ_ALONE = """
import sys, time
import pyarrow.dataset as ds
started = time.monotonic()
rows = sum(b.num_rows for b in ds.dataset(sys.argv[1:], format="parquet").to_batches())
print(rows, time.monotonic() - started)
"""


def _export(lab: Lab, run: str, n: int, opts: ScaleOptions, log) -> dict:
    folder = lab.root / "scale-shards" / str(n)
    log(f"scale {n:,}: writing {n:,} rows of {opts.row_tokens} tokens in shards of {opts.shard_rows}")
    paths = write_shards(folder, run, n, opts.shard_rows, opts.row_tokens)
    data_bytes = sum(p.stat().st_size for p in paths)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": lab.redis_url, "OUTPUT_DIR": str(folder)}
    os.sync()  # the reads below start with the shards written out, for both sides alike
    log(f"scale {n:,}: pyarrow.dataset reading {len(paths)} shards ({data_bytes / 2**20:,.0f} MiB)")
    alone = run_measured([sys.executable, "-c", READ_ALONE, *map(str, paths)], env, cwd=str(ROOT),
                         timeout=opts.timeout)
    rows_read, read_s = alone.output.split()[-2:]
    out = {"source_rows": int(rows_read), "source_bytes": data_bytes, "shards": len(paths),
           "pyarrow_dataset": {"wall_s": alone.wall_seconds, "read_s": float(read_s),
                               "peak_rss_bytes": alone.hwm_bytes, "cpu_s": alone.cpu_seconds}}
    cores = min(os.cpu_count() or 1, 8)
    # --rows-per-file below the shards' rows sends every shard through the row-by-row path
    # (ledger lookups, rewrite): the worst case, where every shard has rows to leave out.
    variants = [("one_job", 1, 10_000), ("default_jobs", 0, 10_000), ("all_cores", cores, 10_000)]
    if opts.export_worst_case:
        variants.append(("all_cores_every_row", cores, opts.shard_rows - 1))
    for label, jobs, rows_per_file in variants:
        dest = lab.root / "scale-export" / f"{n}-{label}"
        log(f"scale {n:,}: python -m producer export --jobs {jobs} --rows-per-file {rows_per_file}")
        child = run_measured([sys.executable, "-m", "producer", "export", str(dest), "--run", run,
                              "--jobs", str(jobs), "--rows-per-file", str(rows_per_file),
                              "--redis-url", lab.redis_url], env, cwd=str(ROOT), timeout=opts.timeout)
        if child.returncode != 0:
            raise RuntimeError(f"export exited {child.returncode}:\n{child.output[-2000:]}")
        manifest = json.loads((dest / "manifest.json").read_text())
        out[label] = {"jobs": jobs, "rows_per_file": rows_per_file, "wall_s": child.wall_seconds,
                      "cpu_s": child.cpu_seconds, "peak_rss_bytes": child.hwm_bytes,
                      "ru_maxrss_bytes": child.peak_rss_bytes,
                      "rows_per_s": int(rows_read) / child.wall_seconds,
                      "over_read": child.wall_seconds / alone.wall_seconds,
                      "manifest": {k: manifest[k] for k in ("rows", "source_rows", "duplicates_dropped",
                                                            "left_out", "shards_whole", "shards_rewritten")}}
        _remove(dest)
    out["cores"] = cores
    _remove(folder)
    return out


def _producer(lab: Lab, n: int, opts: ScaleOptions, log) -> dict:
    path = write_jsonl(lab.root / "prompts" / f"scale-{n}.jsonl", repeated(n))
    log(f"scale {n:,}: python -m producer enqueue ({n:,} lines, no worker)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": lab.redis_url}
    child = run_measured([sys.executable, "-m", "producer", "enqueue", str(path), "--run", f"pm-{n}",
                          "--max-queued", "0", "--redis-url", lab.redis_url], env, cwd=str(ROOT),
                         timeout=opts.timeout)
    if child.returncode != 0:
        raise RuntimeError(f"producer enqueue exited {child.returncode}:\n{child.output[-2000:]}")
    path.unlink()
    return {"lines": n, "peak_rss_bytes": child.hwm_bytes, "ru_maxrss_bytes": child.peak_rss_bytes,
            "wall_s": child.wall_seconds,
            "cpu_s": child.cpu_seconds, "prompts_per_s": n / child.wall_seconds}


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
