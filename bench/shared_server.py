"""Several workers on one server (or one gateway): the queue each server reports, each worker's share,
and whether a worker said it was CPU-bound.

What the saturation part measures beyond tokens/s when a topology has more than
one worker process (`1x64/w3`: three workers bound to one batch-64 server;
`gw:2x64/w4`: four workers bound to one gateway in front of two): each
server's waiting queue, sampled from `/standin/stats` while it ran (the middle
half of its busy samples, so the cold start and the drain do not count), the
samples each worker stored (its shard files, named after it), and the
CPU-bound signal every worker writes into its heartbeat
(`workers/servers/cpu_bound.py`), read the way `status` reads it.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq
import redis

from contract.fleet import heartbeats


def steady_waiting_median(samples: list[tuple[int, int]]) -> float | None:
    """Median waiting count over the middle half of the samples taken while the server ran something."""
    busy = [w for r, w in samples if r > 0]
    middle = busy[len(busy) // 4: 3 * len(busy) // 4] or busy
    return statistics.median(middle) if middle else None


def worker_rows(folder: Path, names: list[str]) -> dict[str, int]:
    """Samples each worker stored: the rows of the shard files whose names carry its name."""
    counts = {name: 0 for name in names}
    for path in folder.glob("part-*.parquet"):
        for name in names:
            if path.name.startswith(f"part-{name}-"):
                counts[name] += pq.read_metadata(path).num_rows
                break
    return counts


def share_spread(rows: dict[str, int]) -> float | None:
    """The smallest worker's finished samples over the largest's (1.0: equal shares)."""
    values = list(rows.values())
    return min(values) / max(values) if values and max(values) else None


class CpuSignals:
    """Which workers' heartbeats said CPU-bound during a run, polled with the run's progress."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.fired: set[str] = set()
        self.shares: list[float] = []

    def poll(self) -> None:
        for record in heartbeats.read_all(self.client):
            cpu = record.get("cpu") or {}
            if cpu.get("bound"):
                self.fired.add(record["worker"])
            if cpu.get("share") is not None:
                self.shares.append(cpu["share"])


def ready_to_share(records: list[dict], count: int) -> set[str]:
    """The workers (names before the `@`) whose heartbeat shows every bound server usable (a
    target set) and shared by `count` workers (`workers/servers/sharers.py`): each then starts at its share."""
    return {r["worker"].split("@")[0] for r in records
            if r["servers"] and all(s["state"] == "healthy" and s.get("capacity") and s.get("sharers") == count
                                    for s in r["servers"])}


def wait_workers_ready(client: redis.Redis, count: int, timeout: float, watch: list) -> None:
    """Until `count` workers are ready to share (`ready_to_share`), so that the run starts for all
    of them at once, each at its share, and none gets a head start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(ready_to_share(heartbeats.read_all(client), count)) >= count:
            return
        dead = [p for p in watch if not p.alive()]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited before the run:\n{dead[0].tail(30)}")
        time.sleep(0.25)
    raise RuntimeError(f"{count} workers not ready within {timeout:.0f}s")


def sharing_figures(r: dict, part: str, ratio_goal: float) -> list:
    """The rows a topology adds when workers share servers, and the CPU-bound signal's row."""
    from .report import Figure, at_least, at_most

    f, batches, figures = r["fleet"], r["topology"]["batches"], []
    if f["workers"] > 1:
        medians = f["waiting_median"]
        worst = max((m / (b / 4) for m, b in zip(medians, batches) if m is not None), default=None)
        figures.append(Figure(part, "waiting queue, median / (batch / 4), worst server", worst, "{:.2f}",
                              goal="<= 1", met=at_most(worst, 1.0),
                              note="medians " + ", ".join(f"{m} of batch {b}" for m, b in zip(medians, batches))
                                   + " (each server's /standin/stats, middle half of its busy samples)"))
        spread = share_spread(f["worker_rows"])
        figures.append(Figure(part, "finished share, smallest / largest worker", spread, "{:.2f}",
                              goal=">= 0.8", met=at_least(spread, 0.8),
                              note="samples stored: " + ", ".join(map(str, f["worker_rows"].values()))))
    # Short answers on a large batch are where one process can fall behind its servers: there the
    # signal should fire exactly when the fleet fell short; long answers never make a worker CPU-bound.
    fired, judged = len(f["cpu_bound_workers"]), r["topology"]["profile"] == "short"
    expect = judged and r["ratio"] < ratio_goal
    figures.append(Figure(part, "workers that said CPU-bound", fired, "{:.0f}", f"of {f['workers']}",
                          goal=">= 1 (fell short)" if expect else "0",
                          met=fired >= 1 if expect else fired == 0,
                          note=f"highest CPU share reported {f['cpu_share_max'] or 0:.2f} of the usable core; "
                               "heartbeats as `status` reads them (workers/servers/cpu_bound.py)"))
    return figures
