"""Samples at node rate: a big fleet's samples as Redis sees them, each node sending what a node at `rate` sends.

A fleet of 5,000 nodes at 2 samples a second each is 10,000 samples a second
from 5,000 connections, each node batching only what two samples a second let
it batch. One fast worker storing ~200 samples a second is not that: its take
and its group commit each carry 50 to 250 samples, and Redis, idle between its
requests, pays a wakeup for each. Redis's cost is mostly per round trip (a
wakeup and its socket calls, 60-110 us of Redis CPU on the bench's machine, nearly
whatever the round trip carries), so what a sample costs depends on how many
round trips it shares, which is the node's rate, not the bench's.

So driven nodes (simulated workers of the fleet's state, each on its own
connection, in `processes` x `threads` of the bench) each run a node's Redis
work through the project's own functions, shaped as a node at `rate` shapes it
(`node_shape`), as fast as the clients can:

- kombu's take after a group commit's acks: BRPOP of the run's queue lists
  (kombu's loop, the worker transport's `Channel._read_and_take`), then
  `kombu_take.take` of as many more as the acks freed (the group, less BRPOP's
  one), with its token, as the worker takes;
- each message's intake (`confirmed_intake.take`: `Ledger.intake` on a Redis
  without replicas), naming the driven node;
- the group commit's ledger steps (`ShardBook.writing` before the shard write,
  `ShardBook.mark` after: the done marks, the deliveries cleared and the messages
  acknowledged, `kombu_take.forget`, each with its replication barrier);
- the task-event flushes of the group's seconds (one PUBLISH a `FLEET_TASK_EVENTS_INTERVAL`,
  `workers/reporting/events.py`, 3 events a sample) to the subscribed listener.

The messages are the run's real ones (`fleet_state.message_for`), queued with
their ledger entries before the clock starts. Each node's first group warms its
connection and scripts, uncounted. Redis's CPU (INFO cpu) over the measured
groups, divided by the samples stored, is the per-sample figure; the clients
count every request they send (one per command or pipeline: a round trip),
by its first command.
"""
from __future__ import annotations

import base64
import json
import multiprocessing as mp
import os
import queue as queues
import secrets
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import redis

from .fleet_state import EVENTS, RUN, FleetState, message_for, per_sample, redis_by_command, redis_calls, redis_cpu
from .lab import Lab

EVENTS_PER_SAMPLE = 3  # task-received, task-started, task-succeeded


@dataclass(frozen=True)
class NodeShape:
    """What one node at `rate` samples a second batches (`node_shape`)."""
    rate: float
    group: int            # samples per group commit, and messages per take (the group's acks free as many)
    publishes: float      # task-event flushes (PUBLISHes) per group
    events: int           # task events per flush


def node_shape(rate: float, max_wait: float, group_rows: int, flush_interval: float) -> NodeShape:
    """A group commit is written when its oldest sample has waited `max_wait` (FLEET_SHARD_MAX_WAIT),
    so it holds that sample and those stored meanwhile (1 + rate x max_wait, at most `group_rows`);
    its tasks' acks free as many places, which kombu's next take fills. The node flushes its task
    events once a `flush_interval`, or less often when it has fewer than one to send by then."""
    group = max(1, min(group_rows, 1 + round(rate * max_wait)))
    flushes_per_s = min(1 / flush_interval, EVENTS_PER_SAMPLE * rate)
    return NodeShape(rate, group, publishes=flushes_per_s * group / rate,
                     events=max(1, round(EVENTS_PER_SAMPLE * rate / flushes_per_s)))


def node_shape_of(rate: float, settings) -> NodeShape:
    return node_shape(rate, settings.shard_max_wait, settings.group_rows, settings.task_events_interval)


# --- the clients' count of what they send ------------------------------------------------

_LOCAL = threading.local()
_COUNTING = threading.Lock()


def sent() -> Counter:
    """Requests this thread's node sent, by first command (a node's thread and its task threads
    share one counter: `counting_for`)."""
    if not hasattr(_LOCAL, "sent"):
        _LOCAL.sent = Counter()
    return _LOCAL.sent


def counting_for(counter: Counter) -> None:
    """This thread's requests count in `counter` (a node's task threads count in their node's)."""
    _LOCAL.sent = counter


def _first_command(packed) -> str:
    head = packed[0] if isinstance(packed, (list, tuple)) else packed
    parts = bytes(head[:64]).split(b"\r\n")
    return parts[2].decode(errors="replace").lower() if len(parts) > 2 else "?"


class CountedConnection(redis.Connection):
    """A connection that counts each request it sends: a command, or a pipeline's commands at once."""

    def send_packed_command(self, command, check_health=True):
        with _COUNTING:
            sent()[_first_command(command)] += 1
        return super().send_packed_command(command, check_health)


# --- one driven node ---------------------------------------------------------------------

@dataclass(frozen=True)
class Drive:
    """What every driven node of a client process is told (sent to it whole: it is spawned)."""
    url: str
    queue: str
    shape: NodeShape
    groups: int           # measured group commits per node, after one to warm up
    most: int             # FLEET_MAX_DELIVERIES: the intake's `most`


class Node:
    """One simulated worker's per-sample Redis work, on its own connection."""

    def __init__(self, drive: Drive, worker: str):
        from contract.redis_link.connections import BlockingPool
        from contract.broker.kombu_redis import queue_lists
        from contract.broker.worker_lease import Holder
        from workers.intake.reconcile import ShardBook

        # the worker's own kind of pool (`contract.redis_link.connections`: scripts loaded on connect), counted
        pool = BlockingPool.from_url(drive.url, connection_class=CountedConnection, max_connections=2)
        self.client, self.drive, self.worker = redis.Redis(connection_pool=pool), drive, worker
        self.lists, self.holder = queue_lists(drive.queue), Holder.draw()
        self.book, self.row, self.seq, self.credit = ShardBook(self.client), _row(worker), 0, 0.0
        self.events = _task_events(worker, drive.shape.events)
        self.counter: Counter = Counter()  # its requests, from its own thread and its task threads
        self.tasks = ThreadPoolExecutor(max_workers=drive.shape.group, thread_name_prefix=f"{worker}-task",
                                        initializer=counting_for, initargs=(self.counter,))

    def group(self) -> int:
        """Take a group's messages, take each in, commit them, flush the group's events: samples stored."""
        from contract.broker import kombu_take
        from kombu.utils.json import loads
        from workers.intake import confirmed_intake

        popped = self.client.brpop(self.lists, timeout=1)
        if popped is None:
            return 0
        first = loads(popped[1].decode())
        taken = kombu_take.take(self.client, self.lists, first, self.drive.shape.group - 1, self.holder,
                                token=kombu_take.new_token(), lane=str(threading.get_ident()))
        messages = [t.payload for t in taken]  # BRPOP's first, then the rest
        prompt_ids = [message["headers"]["id"].split(":", 1)[1] for message in messages]
        # each message's task takes its prompt in on its own thread, all starting together, as a
        # worker's do after a take (their intakes share round trips: `group_intake`)
        list(self.tasks.map(lambda pid: confirmed_intake.take(self.client, RUN, pid, self.worker, self.drive.most),
                            prompt_ids))
        rows = [replace(self.row, id=prompt_id) for prompt_id in prompt_ids]
        shard = self._shard_name()
        self.book.writing(RUN, rows, shard)
        self.book.mark(RUN, [(r.id, r.output_len) for r in rows], shard,
                       [m["properties"]["delivery_tag"] for m in messages])
        self._flush_events()
        return len(rows)

    def _flush_events(self) -> None:
        self.credit += self.drive.shape.publishes
        while self.credit >= 1:
            self.client.publish(f"{EVENTS}/task.multi", self.events)
            self.credit -= 1

    def _shard_name(self) -> str:
        self.seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return f"part-{self.worker}-{os.getpid()}-{stamp}-{self.seq:06d}-{secrets.token_hex(6)}.parquet"

    def run(self, out: list) -> None:
        """The measured groups; appends (samples, requests by first command)."""
        counting_for(self.counter)
        with _COUNTING:
            before, samples = Counter(sent()), 0
        for _ in range(self.drive.groups):
            samples += self.group()
        with _COUNTING:
            out.append((samples, sent() - before))


def _row(worker: str):
    """A stored sample's row, as the shard writer hands it to `ShardBook` (its id replaced per prompt)."""
    from contract.storage.schema import Sample

    now = datetime.now(timezone.utc)
    return Sample(id="", input_ids=[1] * 64, prompt_len=64, output_len=100, finish_reason="stop", stop_token=2,
                  think_end_index=None, run=RUN, server="http://sglang:30000", model="bench", max_new_tokens=None,
                  temperature=0.6, top_p=0.95, attempts=1, worker=worker, tokenizer_fingerprint="t",
                  template_fingerprint="t", e2e_latency=1.0, started_at=now, finished_at=now)


def _task_events(worker: str, count: int) -> bytes:
    """One flush of `count` task events as kombu's Redis fanout publishes Celery's `task.multi`
    batch: the JSON event list, base64 in kombu's message envelope."""
    kinds = ("task-received", "task-started", "task-succeeded")
    events = [{"hostname": worker, "utcoffset": 0, "pid": 1234, "clock": 1000 + i, "uuid": str(uuid.uuid4()),
               "timestamp": time.time(), "type": kinds[i % 3], "local_received": time.time(),
               **({"runtime": 9.5, "result": "'stored: part-x.parquet'"} if i % 3 == 2 else {}),
               **({"name": "fleet.generate", "args": "('fleet', 'p')", "kwargs": "{}", "retries": 0}
                  if i % 3 == 0 else {})} for i in range(count)]
    body = base64.b64encode(json.dumps(events).encode()).decode()
    return json.dumps({"body": body, "content-encoding": "utf-8", "content-type": "application/json",
                       "headers": {"hostname": worker}, "properties": {
                           "delivery_mode": 1, "delivery_info": {"exchange": "celeryev", "routing_key": "task.multi"},
                           "priority": 0, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}}).encode()


def _drive(drive: Drive, workers: list[str], ready, go, out) -> None:
    """A client process: its nodes warm up, wait for `go`, then each runs its groups in a thread."""
    nodes = [Node(drive, worker) for worker in workers]
    for node in nodes:
        node.group()
    ready.put(os.getpid())
    go.wait()
    results: list = []
    threads = [threading.Thread(target=node.run, args=(results,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((sum(s for s, _ in results), sum((c for _, c in results), Counter())))


# --- the part ----------------------------------------------------------------------------

def node_rate(lab: Lab, state: FleetState, settings, opts, log, groups: int | None = None) -> dict:
    """Driven nodes' samples at node shape: Redis CPU, requests and commands per stored sample;
    `groups` a node (`opts.node_groups` unless given)."""
    shape, groups = node_shape_of(opts.rate, settings), groups or opts.node_groups
    workers = list(state.holding)[:opts.node_processes * opts.node_threads]
    processes = min(opts.node_processes, len(workers))
    _queue(lab, state, len(workers) * (groups + 2) * shape.group)  # a group to warm up, one to spare
    drive = Drive(lab.redis_url, state.queue, shape, groups, settings.max_deliveries)
    context = mp.get_context("spawn")
    go, ready, out = context.Event(), context.Queue(), context.Queue()
    procs = [context.Process(target=_drive, args=(drive, workers[i::processes], ready, go, out), daemon=True)
             for i in range(processes)]
    for proc in procs:
        proc.start()
    try:
        _gather(ready, procs, opts.timeout)
        before = redis_cpu(lab.client), redis_calls(lab.client), time.monotonic()
        commands = redis_by_command(lab.client)
        go.set()
        done = _gather(out, procs, opts.timeout)
        cpu, calls, seconds = (redis_cpu(lab.client) - before[0], redis_calls(lab.client) - before[1],
                               time.monotonic() - before[2])
        after = redis_by_command(lab.client)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    samples, requests = sum(s for s, _ in done), sum((c for _, c in done), Counter())
    d = _figures(shape, samples, requests, cpu, calls, seconds, per_sample(commands, after, samples))
    d.update(drivers=len(workers), processes=processes, threads=opts.node_threads)
    log(f"node rate: {len(workers)} nodes stored {samples:,} samples at {d['samples_per_s']:,.0f}/s, "
        f"{d['redis_us_per_sample']:.0f} us Redis each, {d['round_trips_per_sample']:.2f} round trips "
        f"({d['redis_us_per_round_trip']:.1f} us each)")
    return d


def _gather(replies, procs: list, timeout: float) -> list:
    """One reply from each client process; raises when one exits without it, or at `timeout`."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < len(procs):
        try:
            got.append(replies.get(timeout=1))
        except queues.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"node-rate clients failed or timed out (exit codes "
                                   f"{[p.exitcode for p in procs]}); see the output above") from None
    return got


def _figures(shape: NodeShape, samples: int, requests: Counter, cpu: float, calls: int, seconds: float,
             by_command: dict) -> dict:
    trips = sum(requests.values())
    scripts_us = by_command.get("evalsha", {}).get("us", 0.0)  # per sample; wall time, nested commands in
    return {"shape": shape.__dict__, "samples": samples, "seconds": seconds, "samples_per_s": samples / seconds,
            "redis_core_share": cpu / seconds, "redis_us_per_sample": cpu / samples * 1e6,
            "round_trips_per_sample": trips / samples, "redis_us_per_round_trip": cpu / trips * 1e6,
            "scripts_us_per_sample": scripts_us,
            "redis_us_per_round_trip_besides_scripts": (cpu / samples * 1e6 - scripts_us) * samples / trips,
            "commands_per_sample": calls / samples,
            "round_trips_by_first_command": {k: round(v / samples, 3) for k, v in requests.most_common()},
            "by_command": by_command}


def _queue(lab: Lab, state: FleetState, count: int) -> None:
    """`count` more prompts of the run, queued: ledger entries and the run's real messages."""
    from contract.ledger.ledger import Ledger

    batch = secrets.token_hex(3)  # fresh prompts however often the part runs on one state
    ids = [f"node-{batch}-{i:06d}" for i in range(count)]
    ledger = Ledger(lab.client, RUN)
    for start in range(0, count, 5000):
        ledger.enqueue([(pid, state.ids) for pid in ids[start:start + 5000]], call="bench")
    for start in range(0, count, 1000):
        with lab.client.pipeline(transaction=False) as pipe:
            for pid in ids[start:start + 1000]:
                pipe.lpush(state.queue, json.dumps(message_for(state.template, pid, str(uuid.uuid4()))))
            pipe.execute()
