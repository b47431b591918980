"""A worker's cost to Redis does not grow with the fleet: few connections, no gossip, no mingle.

Redis serves every worker of the fleet, so what each worker holds there is
multiplied by the number of nodes: its connections (Redis's `maxclients` is
10,000 by default) and the traffic Celery's gossip and mingle add, which grow
with the square of the fleet (every worker receives every other worker's
heartbeat event). Checked on a real worker started the plainest way,
`celery -A workers worker` with no flag, bound to several servers with many
threads: what Redis's CLIENT LIST shows of it while it generates and after.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import redis

from bench.procs import redis_connections_of
from contract.fleet import heartbeats
from contract.redis_link.clock import CLOCK
from contract.keys import AUDIT_PREFIX, WORKER_PREFIX, WORKERS, RunKeys
from contract.ledger.ledger import Ledger
from workers.intake.audit_slice import PAGE
from workers.settings import Settings

from conftest import ROOT, varied_prompts, write_prompts, zygote
from producer.local import Process
from waiting import wait_until

MOST_CONNECTIONS = 5  # the blocking fetch, remote control, the shared pool of 2, the lease keeper's own
N = 300


def plain_worker(fleet, name: str, servers: list[str], **extra: str) -> Process:
    """`celery -A workers worker -n NAME -l INFO`, without --without-gossip or --without-mingle."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{name}@%h", "-l", "INFO"]
    process = zygote().spawn(name, argv, fleet.logs, env=fleet.env(SGLANG_URLS=",".join(servers), **extra))
    fleet.processes.append(process)
    return process


def test_a_busy_worker_with_many_threads_and_servers_holds_at_most_five_redis_connections(fleet, tmp_path):
    # Given a worker started with the plain command, bound to three servers (two stand-ins, one
    # of them under two names), with 96 threads
    _, one = fleet.standin("--step-base", "0.02", "--output-len-max", "60")
    _, two = fleet.standin("--step-base", "0.02", "--output-len-max", "60")
    other_name = one.replace("127.0.0.1", "localhost")
    worker = plain_worker(fleet, "plain", [one, two, other_name], FLEET_CONCURRENCY="96")
    client = redis.Redis.from_url(fleet.redis_url)

    # When it generates a run, its connections sampled throughout
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(N))))
    seen: list[list[dict]] = []

    def finished() -> bool:
        seen.append(redis_connections_of(client, worker.popen.pid))
        return int(client.hget(RunKeys("default").counters, "state:done") or 0) == N

    wait_until(finished, 240, "every prompt stored", fleet, poll=0.1)

    # Then it never held more than five, however many of its threads were busy
    most = max(seen, key=len)
    assert len(most) <= MOST_CONNECTIONS, [(c["cmd"], c["age"], c["idle"]) for c in most]
    # and one of them is kombu's blocking fetch, one the remote-control subscription
    commands = [c["cmd"] for c in seen[-1]]
    assert "brpop" in commands and "psubscribe" in commands
    # and it runs no gossip (no subscription to the other workers' events) and no mingle
    assert client.execute_command("PUBSUB", "NUMPAT") == 1  # remote control's, alone
    assert "mingle" not in worker.log.read_text().lower()
    # and `celery inspect` still reaches it over remote control
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "workers", "inspect", "ping", "-t", "10"],
                         env=fleet.env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "plain@" in out.stdout and "pong" in out.stdout, out.stdout + out.stderr


IN_FLIGHT, SIMULATED_WORKERS, LOST, STALE, PASSING = 20_000, 1000, 30, 10, 10


class SimulatedFleet:
    """Workers that hold prompts as far as Redis can tell: each prompt's deliveries entry names
    its worker and the worker's heartbeat (written through `heartbeats.publish`, the workers' own
    code) lists it, renewed like a live worker's. A prompt named to a live worker that does not
    list it is a stale name; one named to a worker silent for a moment is in passing."""

    def __init__(self, client: redis.Redis, run: str, prompt_ids: list[str]):
        self.client, self.run = client, run
        per = len(prompt_ids) // SIMULATED_WORKERS
        self.holding = {f"sim-{w}@node": prompt_ids[w * per:(w + 1) * per] for w in range(SIMULATED_WORKERS)}
        self.started = CLOCK.now(client) - 86_000  # long before the audit's window

    def note(self, extra: dict[str, str]) -> None:
        """The deliveries entries: every held prompt names its worker; `extra` names others."""
        named = {pid: w for w, pids in self.holding.items() for pid in pids} | extra
        with self.client.pipeline(transaction=False) as pipe:
            items = list(named.items())
            for start in range(0, len(items), 1000):
                pipe.hset(RunKeys(self.run).deliveries, mapping=dict(items[start:start + 1000]))
            pipe.execute()

    def beat(self) -> None:
        self.beaten = time.monotonic()
        for worker, pids in self.holding.items():
            heartbeats.publish(self.client, worker, [], ttl=20, holding=lambda pids=pids: {self.run: pids},
                               started=self.started)


def test_the_audit_finds_lost_messages_among_twenty_thousand_in_flight_with_bounded_reads(fleet, tmp_path):
    # Given a run of one real prompt, then 20,000 more in flight on 1,000 simulated workers (more than
    # a round of the audit reads the heartbeats of: `FLEET_AUDIT_HEARTBEATS`), and among
    # the run's prompts 30 whose message is lost (no entry), 10 named to a live worker that does
    # not hold them (stale names: lost too) and 10 named to a worker silent for a moment (in passing)
    _, url = fleet.standin("--output-len-max", "40")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(1))))
    client = redis.Redis.from_url(fleet.redis_url)
    ledger = Ledger(client, "default")
    [real] = [k.decode() for k in client.hkeys(RunKeys("default").token_ids)]
    raw = client.hget(RunKeys("default").token_ids, real)
    flying = [f"f-{i:05d}" for i in range(IN_FLIGHT)]
    lost, stale, passing = ([f"{kind}-{i:02d}" for i in range(n)]
                            for kind, n in (("lost", LOST), ("stale", STALE), ("passing", PASSING)))
    ledger.enqueue([(pid, raw) for pid in flying + lost + stale + passing], call="test")
    simulated = SimulatedFleet(client, "default", flying)
    simulated.note({**dict.fromkeys(stale, "sim-0@node"), **dict.fromkeys(passing, "gone@node")})
    simulated.beat()
    client.zadd(WORKERS, {"gone@node": CLOCK.now(client) - 5})  # its last heartbeat, seconds ago
    client.config_resetstat()
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 200_000)
    client.slowlog_reset()

    # When a real worker audits it a slice of 2,000 prompts a round
    fleet.worker("auditor", [url], FLEET_AUDIT_INTERVAL="1", FLEET_AUDIT_SLICE="2000")

    def lost_ones_stored() -> bool:
        if time.monotonic() - simulated.beaten > 5:  # the heartbeats live 20 s
            simulated.beat()
        return ledger.states(lost + stale) == ["done"] * (LOST + STALE)

    wait_until(lost_ones_stored, 240, "every lost prompt republished and stored", fleet, poll=1)

    # Then exactly the lost prompts (and the real one) were generated; the held and the passing not
    generated = httpx.get(f"{url}/standin/stats", timeout=10).json()["generations"]
    assert set(generated) == {real, *lost, *stale} and set(generated.values()) == {1}
    assert set(ledger.states(flying + passing)) == {"queued"}
    # and no big key was read whole (no HKEYS, HVALS or HGETALL of a run's hashes, kombu's or the
    # registry), nor any page over 500 entries: every command the worker sent, from Redis's SLOWLOG
    # (threshold 0: it logs them all, with their arguments)
    sent = [[a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in entry["command"]]
            if isinstance(entry["command"], (list, tuple)) else entry["command"].decode(errors="replace").split()
            for entry in client.slowlog_get(200_000)]
    whole = [args for args in sent if args[0].lower() in ("hkeys", "hvals", "hgetall", "smembers", "zrange")
             and not args[1].endswith((":counters", "fleet:runs")) and "LIMIT" not in args]
    assert whole == []
    for args in sent:
        name = args[0].lower()
        if name in ("hmget", "zmscore"):
            assert arguments(args) - 2 <= 500, (name, arguments(args))
        elif name == "mget":
            assert arguments(args) - 1 <= 500, (name, arguments(args))
        elif name == "lrange":
            assert int(args[3]) - int(args[2]) < 200, args
    # and no round read more heartbeats than the bound and one page's workers (a round begins with
    # its read of the run's audit state; SLOWLOG lists the newest first)
    rounds: list[int] = [0]
    for args in reversed(sent):
        if args[0].lower() == "hmget" and args[1] == AUDIT_PREFIX + "default":
            rounds.append(0)
        elif args[0].lower() == "mget" and args[1].startswith(WORKER_PREFIX):
            rounds[-1] += arguments(args) - 1
    assert len(rounds) > 3 and max(rounds) <= Settings().audit_heartbeats + PAGE, max(rounds)


def arguments(args: list[str]) -> int:
    """A command's arguments, its name included, from its SLOWLOG entry (which keeps 32 of them
    and says how many more there were: "... (N more arguments)")."""
    text = " ".join(args)
    more = re.search(r"\.\.\. \((\d+) more arguments\)$", text)
    return len(text[:more.start()].split()) + int(more.group(1)) if more else len(args)
