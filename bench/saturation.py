"""Saturation: does the fleet keep an SGLang server as busy as an ideal client?

Same prompts, same stand-in configuration, fresh stand-ins for each side:
(a) the ideal client (`bench.ideal`) with exactly B requests in flight on
each server of batch B; (b) the fleet: the real producer publishes every
prompt to a real Redis first, then one real `celery -A workers worker` with
every fleet setting at its default (it finds each server's batch itself)
drains it. A topology names its servers' batches and an output profile:
`2x64` (two batch-64 servers), `64+256:short` (a batch-64 and a batch-256
server behind one worker), `long` answers a lognormal around 600 tokens,
`short` about 100; `/wN` runs N worker processes bound to the same servers
(started, and seen ready, before the run is queued, so none takes a head
start), `gw:` puts SGLang's gateway (its stand-in) in front of the servers
and binds the workers to it alone (`bench/shared_server.py` measures the
queues, the shares and the CPU-bound signal). Throughput is measured on the
server side, from `/standin/stats`: for each server, tokens_generated over its
own window first_start..last_end, summed over servers. So start-up of either
side is not counted, and both sides are charged their own drain at the end.

The tail is what the fleet adds after the last token: from the last
generation's end (max last_end) to the moment the last sample is durable (the
newest shard file's mtime).
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .ideal import run_ideal
from .lab import CpuTrace, Lab, Standin, newest_shard_mtime
from .procs import cpu_seconds
from .prompts import repeated, write_jsonl
from .publish import chat_tokenizer, enqueue, sampling_params
from .shared_server import CpuSignals, steady_waiting_median, wait_workers_ready, worker_rows


@dataclass(frozen=True)
class Topology:
    """Servers by their batch sizes, the output profile (long or short answers), how many worker
    processes share them (None: `--fleet-workers`), and whether the workers see them through a gateway."""
    batches: tuple[int, ...]
    profile: str = "long"
    label: str = ""
    workers: int | None = None
    gateway: bool = False

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """`2x64`, `1x256:short`, `64+256:short`, `1x64/w3` (three workers), `gw:2x64/w4` (four workers
        bound to one gateway in front of the two servers)."""
        body, gateway = text.strip(), False
        if body.startswith("gw:"):
            body, gateway = body[3:], True
        body, _, workers = body.partition("/w")
        shape, _, profile = body.partition(":")
        if "x" in shape:
            count, batch = shape.lower().split("x")
            batches = (int(batch),) * int(count)
        else:
            batches = tuple(int(b) for b in shape.split("+"))
        if (profile or "long") not in PROFILES:
            raise ValueError(f"unknown output profile {profile!r} in {text!r} (one of {', '.join(PROFILES)})")
        return cls(batches, profile or "long", text.strip(), int(workers) if workers else None, gateway)

    @property
    def name(self) -> str:
        return self.label or "+".join(map(str, self.batches)) + ("" if self.profile == "long" else f":{self.profile}")

    @property
    def slots(self) -> int:
        return sum(self.batches)

    @property
    def servers_key(self) -> tuple:
        """What the ideal client depends on: the servers and the prompts, not the fleet's side."""
        return (self.batches, self.profile)


@dataclass(frozen=True)
class Profile:
    """Output lengths (the stand-in's lognormal) and how many prompts per batch slot make a run."""
    median: float
    sigma: float
    maximum: int
    prompts_per_slot: float


PROFILES = {
    "long": Profile(600, 0.7, 4000, 5.0),    # reasoning traces: a few dozen requests a second
    "short": Profile(100, 0.3, 300, 30.0),   # short answers: hundreds a second; more batches for a steady state
}
DEFAULT_TOPOLOGIES = "2x64,1x256,1x64:short,1x256:short,1x256:short/w2,64+256:short,1x64/w3,gw:2x64/w4"


@dataclass
class SatOptions:
    prompts: int | None = None   # fixed N per topology; by default the profile's prompts per slot x slots
    prompts_per_slot: float | None = None  # overrides every profile's
    max_new_tokens: int = 8192
    step_base: float = 0.004
    step_per_request: float = 0.00002
    topologies: list[Topology] = field(default_factory=lambda: [Topology.parse(t) for t in
                                                                DEFAULT_TOPOLOGIES.split(",")])
    profiles: dict[str, Profile] = field(default_factory=lambda: dict(PROFILES))
    fleet_env: dict[str, str] = field(default_factory=dict)
    workers: int = 1             # worker processes on the fleet side, each bound to every server
    timeout: float = 900.0

    def standin_options(self, batch: int, profile: str) -> list[str]:
        p = self.profiles[profile]
        return ["--max-running-requests", str(batch),
                "--output-len-median", str(p.median),
                "--output-len-sigma", str(p.sigma),
                "--output-len-max", str(p.maximum),
                "--step-base", str(self.step_base),
                "--step-per-request", str(self.step_per_request)]


def start_standins(lab: Lab, topo: Topology, opts: SatOptions) -> list[Standin]:
    started: list[Standin] = []
    try:
        for batch in topo.batches:
            started += lab.standins(1, opts.standin_options(batch, topo.profile))
    except BaseException:
        lab.stop([s.process for s in started])
        raise
    return started


def server_throughput(stats: list[dict]) -> dict:
    """Output tokens/s seen by the servers: per-server windows, summed (the figure),
    plus the whole-fleet window and the busy-time rate for reference."""
    per_server = []
    for s in stats:
        window = (s["last_end"] or 0) - (s["first_start"] or 0)
        per_server.append({"tokens": s["tokens_generated"], "window_s": window,
                           "busy_s": s["busy_seconds"],
                           "tokens_per_s": s["tokens_generated"] / window if window > 0 else 0.0})
    tokens = sum(s["tokens_generated"] for s in stats)
    start = min(s["first_start"] for s in stats)
    end = max(s["last_end"] for s in stats)
    busy = sum(s["busy_seconds"] for s in stats)
    return {
        "tokens": tokens,
        "tokens_per_s": sum(p["tokens_per_s"] for p in per_server),
        "tokens_per_s_union_window": tokens / (end - start) if end > start else 0.0,
        "tokens_per_busy_s": tokens / busy * len(stats) if busy else 0.0,
        "first_start": start,
        "last_end": end,
        "servers": per_server,
    }


def _stop_all(lab: Lab, standins: list[Standin]) -> None:
    lab.stop([s.process for s in standins])


class RunningSampler:
    """Requests running on the stand-ins, sampled four times a second in a thread.

    The mean over non-idle samples shows how full the batches were on each
    side; it includes the drain at the end, when both sides run dry.
    """

    def __init__(self, standins: list[Standin], period: float = 0.25):
        self.standins, self.period = standins, period
        self.samples: list[int] = []
        self.per_server: list[list[tuple[int, int]]] = [[] for _ in standins]  # (running, waiting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                stats = [s.stats() for s in self.standins]
            except Exception:  # a stand-in being stopped: the run is over
                return
            self.samples.append(sum(x["running"] for x in stats))
            for mine, x in zip(self.per_server, stats):
                mine.append((x["running"], x["waiting"]))

    def __enter__(self) -> "RunningSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def mean(self) -> float | None:
        busy = [r for r in self.samples if r > 0]
        return sum(busy) / len(busy) if busy else None


def measure_ideal(lab: Lab, topo: Topology, prompt_ids: list[tuple[str, list[int]]],
                  opts: SatOptions) -> dict:
    standins = start_standins(lab, topo, opts)
    try:
        pids = [s.process.popen.pid for s in standins]
        cpu0 = sum(cpu_seconds(p) for p in pids)
        with RunningSampler(standins) as running:
            result = run_ideal([(s.url, batch) for s, batch in zip(standins, topo.batches)], prompt_ids,
                               sampling_params(opts.max_new_tokens))
        standin_cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        stats = [s.stats() for s in standins]
    finally:
        _stop_all(lab, standins)
    if result.errors:
        raise RuntimeError(f"ideal client: {result.errors} requests failed")
    return {"throughput": server_throughput(stats), "requests": result.requests,
            "dropped_connections": result.dropped_connections,
            "client_tokens": result.output_tokens, "client_cpu_s": result.client_cpu_seconds,
            "standin_cpu_s": standin_cpu, "wall_s": result.wall_seconds,
            "mean_running_sampled": running.mean(), "running_samples": running.samples}


def measure_fleet(lab: Lab, topo: Topology, prompt_file: Path, total: int, opts: SatOptions) -> dict:
    """One worker: the prompts are queued before it starts. Several: they start first and the run is
    queued once every one of them is ready, so that none takes a head start on the others' share."""
    lab.flush()
    run = "sat-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in topo.name)
    output_dir = lab.output_dir("saturation")
    count = topo.workers or opts.workers
    names = [f"w{i}-{run}" for i in range(count)]
    standins = start_standins(lab, topo, opts)
    gateway = lab.gateway([s.url for s in standins]) if topo.gateway else None
    workers = []
    signals = CpuSignals(lab.client)
    try:
        env = {"SGLANG_URLS": gateway.url if gateway else ",".join(s.url for s in standins),
               "OUTPUT_DIR": str(output_dir), **opts.fleet_env}
        if count > 1:
            workers = [lab.worker(name, env) for name in names]
            wait_workers_ready(lab.client, count, opts.timeout, workers)
        t0 = time.monotonic()
        summary = enqueue(prompt_file, run, opts.max_new_tokens)
        enqueue_s = time.monotonic() - t0
        workers = workers or [lab.worker(name, env) for name in names]
        trace = CpuTrace({**{f"worker{i}": w.popen.pid for i, w in enumerate(workers)}, "redis": lab.redis_pid,
                          **{f"standin{i}": s.process.popen.pid for i, s in enumerate(standins)}})

        def poll() -> None:
            trace.sample()
            signals.poll()

        with RunningSampler(standins) as running:
            states = lab.wait_finished(run, total, opts.timeout, [*workers, *(s.process for s in standins)], poll)
        trace.sample()
        stats = [s.stats() for s in standins]
    finally:
        lab.stop(workers + ([gateway.process] if gateway else []) + [s.process for s in standins])
    throughput = server_throughput(stats)
    durable = newest_shard_mtime(output_dir / run)
    start, end = throughput["first_start"], durable or throughput["last_end"]
    return {
        "throughput": throughput,
        "states": states,
        "published": summary.published,
        "enqueue_s": enqueue_s,
        "tail_s": (durable - throughput["last_end"]) if durable else None,
        "workers": count,
        "gateway": topo.gateway,
        "worker_cpu_s_window": sum(trace.window(f"worker{i}", start, end) for i in range(count)),
        "worker_cpu_s_total": sum(trace.total(f"worker{i}") for i in range(count)),
        "redis_cpu_s_window": trace.window("redis", start, end),
        "standin_cpu_s_window": sum(trace.window(f"standin{i}", start, end) for i in range(len(standins))),
        "window_s": end - start,
        "mean_running_sampled": running.mean(),
        "running_samples": running.samples,
        "waiting_median": [steady_waiting_median(x) for x in running.per_server],
        "server_samples": running.per_server,
        "worker_rows": worker_rows(output_dir / run, names),
        "cpu_bound_workers": sorted(signals.fired),
        "cpu_share_max": max(signals.shares, default=None),
        "fleet_env": env,
    }


def prompt_count(opts: SatOptions, topo: Topology) -> int:
    """The same work per batch slot for every topology of a profile: ramp-up and drain weigh alike."""
    per_slot = opts.prompts_per_slot or opts.profiles[topo.profile].prompts_per_slot
    return opts.prompts or round(per_slot * topo.slots)


def run_saturation(lab: Lab, opts: SatOptions, log) -> list[dict]:
    chat = chat_tokenizer()
    results = []
    ideals: dict[tuple, dict] = {}  # one ideal run per set of servers and prompts, shared by its fleet rows
    for topo in opts.topologies:
        prompts = repeated(prompt_count(opts, topo))
        prompt_file = write_jsonl(lab.root / "prompts" / f"saturation-{len(prompts)}.jsonl", prompts)
        if (topo.servers_key, len(prompts)) not in ideals:
            prompt_ids = list(zip([i for i, _ in prompts], chat.render([m for _, m in prompts])))
            log(f"saturation {topo.name}: ideal client, {len(prompts)} prompts")
            ideals[(topo.servers_key, len(prompts))] = measure_ideal(lab, topo, prompt_ids, opts)
        ideal = ideals[(topo.servers_key, len(prompts))]
        log(f"saturation {topo.name}: fleet")
        fleet = measure_fleet(lab, topo, prompt_file, len(prompts), opts)
        ratio = fleet["throughput"]["tokens_per_s"] / ideal["throughput"]["tokens_per_s"]
        results.append({"topology": asdict(topo) | {"name": topo.name, "slots": topo.slots},
                        "prompts": len(prompts),
                        "ideal": ideal, "fleet": fleet, "ratio": ratio,
                        "same_tokens": ideal["throughput"]["tokens"] == fleet["throughput"]["tokens"]})
        log(f"  ideal {ideal['throughput']['tokens_per_s']:,.0f} tok/s, fleet "
            f"{fleet['throughput']['tokens_per_s']:,.0f} tok/s, ratio {ratio:.3f}, "
            f"tail {fleet['tail_s']:.2f}s, waiting medians {fleet['waiting_median']}, "
            f"rows per worker {fleet['worker_rows']}, CPU-bound {fleet['cpu_bound_workers']}")
    return results
