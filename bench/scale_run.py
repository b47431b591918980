"""Scale, real run: N prompts through the producer, Redis, a worker and an instant stand-in,
each per-prompt cost compared between the run's first and last tenth.

`python -m producer enqueue` publishes the N prompts first (no worker running,
`--max-queued 0`), then one real worker drains them against a stand-in that
answers at once (the fleet's own cost, not a GPU's, is what could grow). Every
0.2 s the bench samples the ledger's counts (enqueued, done), the CPU seconds
of the producer, the worker, Redis and the stand-in, and the latency of one
`collect_status` call. A tenth is charged between the moments the count
crosses 1% and 10% of N (first) and 90% and 99% (last), leaving out start-up
and the final group commit; for each cost the figure is last / first.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from .lab import ROOT, CpuTrace, Lab
from .prompts import repeated, write_jsonl

INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0",
           "--output-len-median", "200", "--output-len-max", "300"]
FIRST, LAST = (0.01, 0.10), (0.90, 0.99)


@dataclass
class RealRunOptions:
    prompts: int = 10_000
    timeout: float = 3600.0


class Trace:
    """Samples of one phase: time, the count that advances, CPU of some processes, status latency."""

    def __init__(self, pids: dict[str, int]):
        self.cpu = CpuTrace(pids)
        self.points: list[tuple[float, int]] = []
        self.status: list[tuple[float, float]] = []

    def crossing(self, count: float) -> float | None:
        """When the count reached `count` (interpolated between samples)."""
        for (t0, c0), (t1, c1) in zip(self.points, self.points[1:]):
            if c0 <= count <= c1 and c1 > c0:
                return t0 + (t1 - t0) * (count - c0) / (c1 - c0)
        return None

    def costs(self, total: int, share: tuple[float, float]) -> dict:
        start, end = self.crossing(share[0] * total), self.crossing(share[1] * total)
        if start is None or end is None:
            return {}
        prompts = (share[1] - share[0]) * total
        costs = {"s_per_prompt": (end - start) / prompts}
        for name in self.cpu.pids:
            costs[f"{name}_cpu_ms_per_prompt"] = self.cpu.window(name, start, end) / prompts * 1000
        latencies = [ms for t, ms in self.status if start <= t <= end]
        if latencies:
            costs["status_ms"] = statistics.median(latencies)
        return costs


def run_real(lab: Lab, opts: RealRunOptions, log) -> dict:
    from contract.ledger.ledger import Ledger
    from contract.settings import SharedSettings
    from contract.run.spec import load_spec
    from producer.status import collect_status

    lab.flush()
    run, n = "scale-real", opts.prompts
    path = write_jsonl(lab.root / "prompts" / f"scale-real-{n}.jsonl", repeated(n))
    ledger, prefix = Ledger(lab.client, run), SharedSettings().queue_prefix
    memory_before = int(lab.client.info("memory")["used_memory"])

    def sample(trace: Trace, count: int) -> None:
        trace.cpu.sample()
        trace.points.append((time.time(), count))
        spec = load_spec(lab.client, run)
        if spec is not None:
            started = time.perf_counter()
            collect_status(lab.client, spec, prefix)
            trace.status.append((time.time(), (time.perf_counter() - started) * 1000))

    log(f"scale real run: python -m producer enqueue ({n:,} prompts, no worker yet)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": lab.redis_url}
    with open(lab.logs / "scale-producer.log", "wb") as sink:
        producer = subprocess.Popen([sys.executable, "-m", "producer", "enqueue", str(path), "--run", run,
                                     "--max-queued", "0"], env=env, cwd=str(ROOT), stdout=sink,
                                    stderr=subprocess.STDOUT)
    enqueue = Trace({"producer": producer.pid, "redis": lab.redis_pid})
    deadline = time.monotonic() + opts.timeout
    while producer.poll() is None and time.monotonic() < deadline:
        sample(enqueue, ledger.tally().enqueued)
        time.sleep(0.05)
    if producer.wait(timeout=60) != 0:
        raise RuntimeError(f"producer exited {producer.returncode}; see {lab.logs / 'scale-producer.log'}")
    enqueue.points.append((time.time(), ledger.tally().enqueued))

    standin = lab.standins(1, INSTANT)[0]
    worker = lab.worker("scale", {"SGLANG_URLS": standin.url, "OUTPUT_DIR": str(lab.output_dir("scale-real"))})
    log(f"scale real run: one worker drains {n:,} prompts (instant stand-in)")
    drain = Trace({"worker": worker.popen.pid, "redis": lab.redis_pid, "standin": standin.process.popen.pid})
    try:
        while True:
            tally = ledger.tally()
            sample(drain, tally.done + tally.dead)
            if tally.done + tally.dead >= n:
                break
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"real run not finished (tally {tally}):\n{worker.tail(30)}")
            time.sleep(0.2)
    finally:
        lab.stop([worker, standin.process])
    tally = ledger.tally()
    memory_after = int(lab.client.info("memory")["used_memory"])
    result = {"prompts": n, "tally": tally.by_state(),
              "bytes_per_finished": (memory_after - memory_before) / n,
              "enqueue": {"first": enqueue.costs(n, FIRST), "last": enqueue.costs(n, LAST)},
              "drain": {"first": drain.costs(n, FIRST), "last": drain.costs(n, LAST)}}
    for phase in ("enqueue", "drain"):
        first, last = result[phase]["first"], result[phase]["last"]
        result[phase]["ratio"] = {k: last[k] / first[k] for k in first if k in last and first[k]}
    path.unlink()
    lab.flush()
    return result
