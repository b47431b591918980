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

import os
import subprocess
import sys
from pathlib import Path

import redis

from contract.keys import RunKeys

from conftest import ROOT, varied_prompts, write_prompts, zygote
from producer.local import Process
from waiting import wait_until

MOST_CONNECTIONS = 4
N = 300


def connections_of(client: redis.Redis, pid: int) -> list[dict]:
    """The entries of CLIENT LIST whose client end is a socket of process `pid` (its own
    connections, matched by local port through /proc, whoever else talks to Redis)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return [c for c in client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports]


def plain_worker(fleet, name: str, servers: list[str], **extra: str) -> Process:
    """`celery -A workers worker -n NAME -l INFO`, without --without-gossip or --without-mingle."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{name}@%h", "-l", "INFO"]
    process = zygote().spawn(name, argv, fleet.logs, env=fleet.env(SGLANG_URLS=",".join(servers), **extra))
    fleet.processes.append(process)
    return process


def test_a_busy_worker_with_many_threads_and_servers_holds_at_most_four_redis_connections(fleet, tmp_path):
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
        seen.append(connections_of(client, worker.popen.pid))
        return int(client.hget(RunKeys("default").counters, "state:done") or 0) == N

    wait_until(finished, 240, "every prompt stored", fleet, poll=0.1)

    # Then it never held more than four, however many of its threads were busy
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
