"""Fleet size: what N workers cost one Redis, at 10, 100 and 1,000 simulated workers.

For each N, in a flushed Redis:
- **state**: N simulated workers, each holding `in_flight` prompts (256) as a
  real worker would leave them: the run's ledger entries (`Ledger.enqueue`),
  kombu's unacknowledged message for each (a real message of the run, taken
  from the queue, under a tag of its own) held under the worker's lease
  (`contract.broker.worker_lease`), the prompt's deliveries
  entry naming its worker, and the worker's heartbeat listing them
  (`heartbeats.publish`). One client listens to the event channel as Flower
  does, so the events' PUBLISH pays for a subscriber.
- **rounds**: each simulated worker's periodic work, through the workers' own
  functions, one round trip per worker as a worker sends it: the health
  round's heartbeat and sharer stamp in one pipeline (`health_beat.beat`,
  every `health_interval`), the lease round (`lease.Leases.round`, every
  quarter lease: the worker's one lease renewed, whatever it holds; the
  prompts are being generated, so their states are not read, and the round
  that reads a slice of them is measured beside), kombu's
  restore sweep (mutex, one page of lapsed leases, every restore interval) and
  Celery's worker-heartbeat event (every HEART_INTERVAL, 10 s). Redis CPU (INFO cpu) per
  worker-second is the sum over these, each per round over its interval.
- **audit**: the lost-message audit of the run (`LostMessageAudit.audit_run`,
  the workers' own), round after round until its pass over every pending
  prompt is over, with `lost` prompts planted without a message: Redis CPU and
  commands per round, and whether every lost one was found.
- **samples**: a real worker (`celery -A workers worker`) on an instant
  stand-in stores `samples` short answers (after a warm-up) beside that
  state: Redis CPU and commands per stored sample (INFO commandstats counts a
  script's own commands, as the issue counted them), and the worker's Redis
  connections (CLIENT LIST, by the worker's own sockets). It stores them as
  fast as it can (~200 a second), so its takes and group commits are shared by
  many samples: it proves the real worker's path, not a big fleet's cost.
- **node rate** (`fleet_nodes`): some of the simulated workers, each on its
  own connection, run a node's per-sample Redis work through the workers' own
  functions, batched as a node at `rate` samples a second batches it: Redis
  CPU, round trips and commands per stored sample, and Redis CPU per round trip.

Redis runs pinned to a core of its own and the bench's processes on the others
(`cores.Pinned`), as a production Redis runs. SLOWLOG runs with threshold 0
throughout (but for the node-rate part's measured pass, which a shorter pass
before it stands for), so the longest command any part sent is measured, not
sampled. The projection (`fleet_figures`): n nodes at `rate` samples a second
each, `in_flight` prompts in flight each, cost n x (rate x per sample + per
worker-second) + the audit's rounds (one per audit interval, whatever n),
judged on the node-rate figure.
"""
from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import redis

from .lab import Lab
from .procs import redis_connections_of
from .prompts import repeated, write_jsonl
from .fleet_state import EVENTS, RUN, FleetState, message_for, per_sample, redis_by_command, redis_calls, redis_cpu
from .publish import enqueue

INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0",
           "--output-len-median", "100", "--output-len-sigma", "0.3", "--output-len-max", "300"]
LIVE = 900  # seconds a simulated worker's heartbeat lives: it stays live through every part


@dataclass
class FleetOptions:
    workers: list[int] = field(default_factory=lambda: [10, 100, 1000])
    in_flight: int = 256          # prompts each simulated worker holds
    rounds: int = 3               # of each kind of periodic work, per simulated worker
    lost: int = 20                # prompts planted without a message, for the audit to find
    samples: int = 1000           # stored by the real worker, after a warm-up
    warmup: int = 200
    audit_slice: int = 5000       # FLEET_AUDIT_SLICE
    rate: float = 2.0             # samples a second per node, for the projection
    nodes: list[int] = field(default_factory=lambda: [100, 1000, 5000])
    node_processes: int = 2       # client processes driving simulated nodes at node rate (`fleet_nodes`)
    node_threads: int = 16        # driven nodes per client process, a connection each
    node_groups: int = 200        # group commits each driven node makes, measured
    timeout: float = 600.0


def run_fleet_size(lab: Lab, opts: FleetOptions, log) -> dict:
    from workers.settings import Settings

    from .cores import Pinned
    from .fleet_figures import projections

    settings = Settings(audit_slice=opts.audit_slice)
    with Pinned(lab.redis_pid) as cores:  # Redis on a core of its own, as in production
        results = {n: _size(lab, n, settings, opts, log) for n in opts.workers}
    lab.flush()
    return {"options": opts.__dict__, "pinned": cores.note, "results": results,
            "projection": projections(results[max(results)], opts, settings)}


def _size(lab: Lab, n: int, settings, opts: FleetOptions, log) -> dict:
    """Every part for `n` simulated workers, in a flushed Redis."""
    from .fleet_nodes import node_rate

    lab.flush()
    log(f"fleet {n}: {n} simulated workers x {opts.in_flight} in flight")
    state = _fill(lab, n, opts)
    with _Listener(lab.redis_url), Longest(lab.client) as longest:
        d = {"workers": n, "in_flight": n * opts.in_flight, **_rounds(lab, state, settings, opts)}
        d["audit"] = _audit(lab, state, settings, opts)
        _renew(lab, state, settings)  # live workers' leases: kombu's sweep must not restore them meanwhile
        d["samples"] = _samples(lab, opts, log)
        node_rate(lab, state, settings, opts, lambda m: log(f"{m} (SLOWLOG on: for the longest command)"),
                  groups=max(1, opts.node_groups // 4))
        with longest.paused():  # logging every command would add ~10% to the Redis CPU measured
            d["node_rate"] = node_rate(lab, state, settings, opts, log)
    (p99, kind), (p999, tail_kind) = longest.percentile(0.99), longest.percentile(0.999)
    d["longest"] = {"ms": longest.us / 1000, "command": longest.command, "steady_ms": p99 / 1000,
                    "steady": kind, "p999_ms": p999 / 1000, "p999": tail_kind,
                    "commands_seen": sum(len(v) for v in longest.by_name.values()), "medians": longest.medians()}
    log(f"fleet {n}: {d['node_rate']['redis_us_per_sample']:.0f} us Redis per sample at node rate "
        f"({d['samples']['redis_us_per_sample']:.0f} from one real worker), {d['redis_us_per_worker_s']:.1f} us "
        f"per worker-second, audit {d['audit']['redis_ms_per_round']:.1f} ms a round, longest command "
        f"{d['longest']['ms']:.2f} ms ({d['longest']['command']}), largest 99th percentile "
        f"{d['longest']['steady_ms']:.2f} ms ({d['longest']['steady']})")
    return d


def _up_pool(url: str):
    """A worker's pool of one server, up and preflighted (so the health round stamps it a sharer)."""
    from contract.names import ServerState
    from workers.servers.bindings import ServerPool

    pool = ServerPool([url], max_inflight=256)
    pool.bindings[0].state, pool.bindings[0].preflighted = ServerState.HEALTHY, True
    return pool


# --- the simulated fleet's state -----------------------------------------------------------

def _fill(lab: Lab, n: int, opts: FleetOptions) -> FleetState:
    from contract.fleet import heartbeats
    from contract.broker import kombu_redis
    from contract.redis_link.clock import CLOCK
    from contract.keys import LEASES, RunKeys
    from contract.ledger.ledger import Ledger
    from contract.broker.worker_lease import Holder

    client = lab.client
    path = write_jsonl(lab.root / "prompts" / "fleet-one.jsonl", [("template", repeated(1)[0][1])])
    enqueue(path, RUN, 512)
    queue = _queue_of(client)
    raw_message = client.rpop(queue)  # a real message of the run: the template of every simulated one
    message_bytes = len(raw_message)
    template = json.loads(raw_message)
    ids = client.hget(RunKeys(RUN).token_ids, "template")
    ledger = Ledger(client, RUN)
    holding = {f"sim-{w:04d}@node": [f"s{w:04d}-{i:03d}" for i in range(opts.in_flight)] for w in range(n)}
    lost = ["template"] + [f"lost-{i:03d}" for i in range(opts.lost)]  # the template's message is taken
    everyone = [pid for pids in holding.values() for pid in pids] + lost
    for start in range(0, len(everyone), 5000):
        ledger.enqueue([(pid, ids) for pid in everyone[start:start + 5000]], call="bench")
    now, tags = CLOCK.now(client), {}
    holders = {worker: Holder.draw() for worker in holding}
    for worker, pids in holding.items():
        tags[worker] = [str(uuid.uuid4()) for _ in pids]
        with client.pipeline(transaction=False) as pipe:
            for pid, tag in zip(pids, tags[worker]):
                message = message_for(template, pid, tag)
                pipe.hset(kombu_redis.UNACKED, tag, json.dumps([message, "", queue]))
            pipe.zadd(LEASES, {holders[worker].name: now})
            pipe.zadd(kombu_redis.UNACKED_INDEX, dict.fromkeys(tags[worker], holders[worker].score))
            pipe.hset(RunKeys(RUN).deliveries, mapping=dict.fromkeys(pids, worker))
            pipe.execute()
        heartbeats.publish(client, worker, [], ttl=LIVE, holding=lambda pids=pids: {RUN: pids},
                           started=now - 86_400)
    return FleetState(holding, tags, lost, queue, message_bytes, template, ids, holders)


def _renew(lab: Lab, state: FleetState, settings) -> None:
    from contract.broker import worker_lease
    from contract.redis_link.clock import CLOCK

    now = CLOCK.now(lab.client)
    for holder in state.holders.values():
        worker_lease.renew(lab.client, holder, now, settings.lease_seconds)


def _queue_of(client) -> str:
    from contract.run.spec import run_queues

    return run_queues(client, "fleet.generate")[RUN]


# --- periodic work per simulated worker ----------------------------------------------------

def _rounds(lab: Lab, state: FleetState, settings, opts: FleetOptions) -> dict:
    """Redis CPU (us) of each kind of round, per worker and round, and per worker-second."""
    from contract.broker import kombu_redis
    from contract.redis_link.clock import CLOCK
    from workers.intake import health_beat, lease
    from workers.intake.consumer import HEART_INTERVAL, Delivery

    client = lab.client
    event = json.dumps({"hostname": "x", "type": "worker-heartbeat", "freq": 2.0, "sw_ident": "py-celery",
                        "sw_ver": "5.7.0", "sw_sys": "Linux", "active": 256, "processed": 100_000,
                        "loadavg": [1.0, 1.0, 1.0], "timestamp": time.time(), "clock": 1}).encode() * 2

    pools = {worker: _up_pool(f"http://{worker}:30000") for worker in state.holding}

    def health(worker: str) -> None:  # what the worker's health round writes: one pipeline
        health_beat.beat(client, worker, pools[worker], LIVE, holding=lambda: {RUN: state.holding[worker]},
                         started=0.0)

    held = {worker: {tag: Delivery(tag, None, RUN, pid) for tag, pid in zip(state.tags[worker], pids)}
            for worker, pids in state.holding.items()}
    keepers = {(worker, generating): lease.Leases(client, lease.hold_limit(settings), settings.lease_seconds,
                                                  running=lambda d, g=generating: g, holder=state.holders[worker])
               for worker in state.holding for generating in (True, False)}

    def leases(worker: str, generating: bool = True) -> None:
        keepers[worker, generating].round(held[worker])

    def sweep(worker: str) -> None:
        if client.set("unacked_mutex", worker, nx=True, ex=60):
            client.zrevrangebyscore(kombu_redis.UNACKED_INDEX, CLOCK.now(client) - settings.lease_seconds, 0,
                                    start=0, num=kombu_redis.RESTORE_PAGE, withscores=True)
            client.delete("unacked_mutex")

    def heart(worker: str) -> None:
        client.publish(f"{EVENTS}/worker.heartbeat", event)

    # Every round renews the worker's lease. The simulated prompts are in flight, so being generated:
    # their states are not read (`Leases.round`); the same round for prompts none of which is
    # generated (a slice of states read) is measured beside, not counted in the figure a second.
    period = lease.round_period(settings.lease_seconds)
    kinds = {"health": (health, settings.health_interval), "lease": (leases, period),
             "restore sweep": (sweep, settings.restore_interval), "worker-heartbeat event": (heart, HEART_INTERVAL)}
    beside = {"lease, none generating": (lambda w: leases(w, False), period)}
    per_round = {}
    for name, (work, _) in {**kinds, **beside}.items():
        before = redis_cpu(client), redis_calls(client)
        for _ in range(opts.rounds):
            for worker in state.holding:
                work(worker)
        cpu, calls = redis_cpu(client) - before[0], redis_calls(client) - before[1]
        rounds = opts.rounds * len(state.holding)
        per_round[name] = {"redis_us": cpu / rounds * 1e6, "commands": calls / rounds}
    per_second = sum(per_round[name]["redis_us"] / interval for name, (_, interval) in kinds.items())
    commands = sum(per_round[name]["commands"] / interval for name, (_, interval) in kinds.items())
    return {"rounds": per_round, "intervals": {k: i for k, (_, i) in {**kinds, **beside}.items()},
            "not_counted": list(beside),
            "redis_us_per_worker_s": per_second, "commands_per_worker_s": commands}


# --- the audit -----------------------------------------------------------------------------

def _audit(lab: Lab, state: FleetState, settings, opts: FleetOptions) -> dict:
    """The audit's rounds until its pass is over and every lost prompt was confirmed."""
    from workers.intake.audit import AuditState, LostMessageAudit

    client = lab.client
    found: set[str] = set()

    class Audit(LostMessageAudit):
        def __init__(self):  # no consumer: the rounds alone
            self._stalled = {}

        def _republish(self, app, client, run, queue, confirmed):
            found.update(confirmed)
            return len(confirmed)

    rt = type("Runtime", (), {"redis": client, "settings": settings})()
    audit, audit_state = Audit(), AuditState(client, RUN, fresh=1e9)
    pending = len(state.holding) * opts.in_flight + len(state.lost)
    # a round: a slice, or fewer (FLEET_AUDIT_HEARTBEATS)
    most_rounds = 2 * (pending // min(settings.audit_slice, settings.audit_heartbeats) + 2)
    before, rounds = (redis_cpu(client), redis_calls(client)), 0
    t0 = time.monotonic()
    while rounds < most_rounds and not set(state.lost) <= found:
        audit.audit_run(None, rt, RUN, state.queue, audit_state)
        rounds += 1
    cpu, calls = redis_cpu(client) - before[0], redis_calls(client) - before[1]
    return {"rounds": rounds, "found": len(found & set(state.lost)), "lost": len(state.lost),
            "false": len(found - set(state.lost)), "redis_ms_per_round": cpu / rounds * 1e3,
            "commands_per_round": calls / rounds, "client_s_per_round": (time.monotonic() - t0) / rounds,
            "slice": settings.audit_slice}


# --- a real worker's samples -----------------------------------------------------------------

def _samples(lab: Lab, opts: FleetOptions, log) -> dict:
    prompts = [(f"real-{pid}", msgs) for pid, msgs in repeated(opts.warmup + opts.samples)]
    warm = write_jsonl(lab.root / "prompts" / "fleet-warm.jsonl", prompts[:opts.warmup])
    cost = write_jsonl(lab.root / "prompts" / "fleet-cost.jsonl", prompts[opts.warmup:])
    [standin] = lab.standins(1, INSTANT)
    # Its own audit waits: the bench's audit part measured the audit, and the simulated fleet's lost
    # prompts are not for it to publish again.
    worker = lab.worker("fleet-size", {"SGLANG_URLS": standin.url, "OUTPUT_DIR": str(lab.output_dir("fleet")),
                                       "FLEET_AUDIT_INTERVAL": "3600"})
    watch = [worker, standin.process]
    try:
        enqueue(warm, "fleet-warm", 512)
        lab.wait_finished("fleet-warm", opts.warmup, opts.timeout, watch, interval=0.1)
        worker.signal(signal.SIGSTOP)  # the producer's publishing is not charged to the samples
        try:
            enqueue(cost, "fleet-cost", 512)
            before = redis_cpu(lab.client), redis_calls(lab.client)
            stats = redis_by_command(lab.client)
        finally:
            worker.signal(signal.SIGCONT)
        most: list[dict] = []  # the worker's connections when it held the most

        def count_connections() -> None:
            now = redis_connections_of(lab.client, worker.popen.pid)
            if len(now) > len(most):
                most[:] = now

        lab.wait_finished("fleet-cost", opts.samples, opts.timeout, watch, interval=0.1, on_poll=count_connections)
        cpu, calls = redis_cpu(lab.client) - before[0], redis_calls(lab.client) - before[1]
        after = redis_by_command(lab.client)
    finally:
        lab.stop(watch)
    # Per command, per sample: calls, and Redis's own time in it (INFO commandstats `usec`: a
    # script's includes the commands it calls, which are also listed; the rest of `INFO cpu` is
    # reading requests and writing replies)
    by_command = per_sample(stats, after, opts.samples)
    log(f"fleet: real worker stored {opts.samples} samples, {calls / opts.samples:.1f} commands each")
    return {"samples": opts.samples, "redis_us_per_sample": cpu / opts.samples * 1e6,
            "commands_per_sample": calls / opts.samples, "connections": len(most), "by_command": by_command,
            "connections_seen": [f"{c.get('cmd')} (age {c.get('age')} s)" for c in most]}


# --- Redis's own counters ------------------------------------------------------------------

def _script_names() -> dict[str, str]:
    """SHA1 -> `module.NAME` of every Lua script the fleet sends, for naming EVALSHA calls."""
    import hashlib
    import importlib

    from contract.redis_link.scripts import Lua

    names = {}
    for module in ("contract.ledger.ledger_scripts", "contract.ledger.ledger", "contract.ledger.conversation_ledger",
                   "contract.broker.kombu_take", "workers.intake.deliveries", "contract.ledger.deliveries"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        for attr, value in vars(found).items():
            if isinstance(value, Lua):
                names[hashlib.sha1(value.source.encode()).hexdigest()] = f"{module.rsplit('.', 1)[1]}.{attr}"
    return names


SCRIPTS = _script_names()


class Longest:
    """The longest commands Redis ran while it watched: SLOWLOG at threshold 0 logs every command
    with its own run time (not its wait), drained every 0.2 s so none is dropped unread.

    SLOWLOG's time is wall time, so on a shared machine the longest single one can be any command
    Redis was descheduled in (an LPUSH of one message took 24 ms here, a 256-prompt READ 86 ms at
    a load of 8 on 2 cores), so besides it (`us`, `command`) the figure is each command kind's
    99th percentile, the largest of them (`steady`): a command slow by what it does is slow every
    time it is sent, and `percentile(0.999)` says how far the tail went."""

    def __init__(self, client: redis.Redis):
        self.client, self.us, self.command = client, 0, ""
        self.by_name: dict[str, list[int]] = {}
        self.stop = threading.Event()

    def __enter__(self) -> "Longest":
        self.client.config_set("slowlog-max-len", 50_000)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.slowlog_reset()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()
        return self

    def _drain(self) -> None:
        while not self.stop.wait(0.2):
            self.read()

    def read(self) -> None:
        # GET and RESET in one transaction: a command logged between the two would be reset unread
        # (at node rate that was a third of them).
        with self.client.pipeline(transaction=True) as pipe:
            pipe.slowlog_get(50_000)
            pipe.slowlog_reset()
            entries, _ = pipe.execute()
        for entry in entries:
            words = entry["command"].split() if isinstance(entry["command"], bytes) else list(entry["command"])
            name = (words[0].decode() if isinstance(words[0], bytes) else str(words[0])).lower() if words else ""
            if name in ("slowlog", "info", "config", "client", "multi", "exec"):  # the bench's own
                continue
            if name == "evalsha" and len(words) > 1:
                sha = words[1].decode() if isinstance(words[1], bytes) else str(words[1])
                name = f"evalsha {SCRIPTS.get(sha, sha[:8])}"
            self.by_name.setdefault(name, []).append(entry["duration"])
            if entry["duration"] > self.us:
                shown = [w.decode(errors="replace") if isinstance(w, bytes) else str(w) for w in words[:3]]
                self.us, self.command = entry["duration"], " ".join(shown)[:80]

    def medians(self, most: int = 8) -> dict[str, list[float]]:
        """The `most` command kinds Redis spent most time in: kind -> [how many, median microseconds]."""
        kinds = sorted(self.by_name.items(), key=lambda kv: -sum(kv[1]))[:most]
        return {name: [len(d), float(sorted(d)[len(d) // 2])] for name, d in kinds}

    def percentile(self, share: float = 0.99) -> tuple[float, str]:
        """(microseconds, command kind) of the largest `share` percentile among command kinds."""
        worst = (0.0, "")
        for name, durations in self.by_name.items():
            durations.sort()
            worst = max(worst, (float(durations[min(len(durations) - 1, int(share * len(durations)))]), name))
        return worst

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No command logged during the block: a part that measures Redis's CPU per command runs
        there (threshold 0 costs Redis ~10% more CPU per command at node rate, measured A/B)."""
        self.client.config_set("slowlog-log-slower-than", -1)
        try:
            yield
        finally:
            self.client.config_set("slowlog-log-slower-than", 0)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.read()
        self.client.config_set("slowlog-log-slower-than", 10_000)


class _Listener:
    """A subscriber to Celery's event channel, as Flower is, reading what it gets."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url)
        self.stop = threading.Event()

    def __enter__(self) -> "_Listener":
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(f"{EVENTS}*")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        while not self.stop.is_set():
            self.pubsub.get_message(timeout=0.5)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.pubsub.close()
