"""A real Redis Sentinel topology on free loopback ports: a primary, its replicas (one unless
told), three Sentinels.

The processes are the ones production runs (`redis-server`, `redis-server
--sentinel`), with Sentinel's timings shortened so a failover takes seconds:
a primary is down after `DOWN_AFTER_MS` without an answer, and a failover
that stalls is retried after `FAILOVER_TIMEOUT_MS`. `url` is the fleet's
`REDIS_URL` for it (kombu's `sentinel://h:p;sentinel://h:p/0` form).
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from producer.local import Process, free_port, redis_server_binary, spawn, wait_for

MASTER = "mymaster"
DOWN_AFTER_MS = 1500
FAILOVER_TIMEOUT_MS = 4000


@dataclass
class Topology:
    logs: Path
    servers: dict[int, Process] = field(default_factory=dict)    # port -> redis-server
    sentinels: dict[int, Process] = field(default_factory=dict)  # port -> redis-server --sentinel
    replicas: int = 1

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinels) + "/0"

    def start(self) -> "Topology":
        primary = self._server()
        for _ in range(self.replicas):
            self._server(replica_of=primary)
        for _ in range(3):
            self._sentinel(primary)
        wait_for(self._settled, 60, "three Sentinels that see the primary, its replicas and each other")
        return self

    def primary_port(self) -> int:
        """Where the Sentinels say the master is now."""
        port = next(iter(self.sentinels))
        host, master = redis.Redis(port=port, socket_timeout=2).sentinel_get_master_addr_by_name(MASTER)
        return int(master)

    def primary(self) -> Process:
        return self.servers[self.primary_port()]

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    def failover(self, patience: float = 60) -> None:
        """A clean switch, as an operator asks for it: asked again while the Sentinel answers
        NOGOODSLAVE (it has not yet read, from the primary's INFO every 10 s, the replica that a
        switch moments ago made of the old primary), as an operator would ask again."""
        sentinel = redis.Redis(port=next(iter(self.sentinels)), socket_timeout=5)
        deadline = time.monotonic() + patience
        while True:
            try:
                sentinel.execute_command("SENTINEL", "FAILOVER", MASTER)
                return
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def switch_over(self, away_from: int, tries: int = 3) -> int:
        """`failover` until the Sentinels name another primary, as an operator asks again when
        Sentinel aborts one (it does when the replica it promotes has not reported its new role
        within the failover timeout, as on a busy machine); returns the new primary's port."""
        for attempt in range(tries):
            try:
                self.failover()
            except redis.ResponseError as exc:  # INPROG: the last one is still running
                if "INPROG" not in str(exc):
                    raise
            try:
                return self.wait_switched(away_from, timeout=20 if attempt < tries - 1 else 60)
            except TimeoutError:
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def wait_switched(self, away_from: int, timeout: float = 60) -> int:
        """Until every Sentinel names a new primary and that server says it is one; returns its port."""
        def switched() -> bool:
            ports = {int(redis.Redis(port=p, socket_timeout=2).sentinel_get_master_addr_by_name(MASTER)[1])
                     for p in self.sentinels}
            return len(ports) == 1 and away_from not in ports and \
                self.client(ports.pop()).info("replication")["role"] == "master"
        wait_for(switched, timeout, f"a failover away from port {away_from}")
        return self.primary_port()

    def wait_replica(self, port: int, of: int, timeout: float = 60) -> None:
        """Until `port` serves as an in-sync replica of `of`."""
        def following() -> bool:
            info = self.client(port).info("replication")
            return info["role"] == "slave" and int(info["master_port"]) == of and info["master_link_status"] == "up"
        wait_for(following, timeout, f"port {port} a replica of {of}")

    def revive(self, port: int, replica_of: int) -> None:
        """Start a killed server again on its port and data, as the current primary's replica
        (as a supervisor restarts it; the Sentinels already list it as one)."""
        self._server(replica_of=replica_of, port=port)
        self.wait_replica(port, replica_of)

    def stop(self) -> None:
        for process in [*self.sentinels.values(), *self.servers.values()]:
            process.signal(signal.SIGCONT)  # a frozen server cannot take its SIGTERM
            process.stop(timeout=10)

    def _server(self, replica_of: int | None = None, port: int | None = None) -> int:
        port = port or free_port()
        data = self.logs / f"redis-{port}"
        data.mkdir(parents=True, exist_ok=True)
        argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(data), "--appendonly", "yes", "--maxmemory-policy", "noeviction",
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        if replica_of:  # the replica a failover promotes keeps every write it was sent
            argv += ["--replicaof", "127.0.0.1", str(replica_of), "--appendfsync", "always"]
        self.servers[port] = spawn(f"redis-{port}", argv, self.logs)
        wait_for(lambda: self.client(port).ping(), 20, f"redis on port {port}", self.servers[port])
        return port

    def _sentinel(self, primary: int) -> None:
        port = free_port()
        conf = self.logs / f"sentinel-{port}.conf"  # Sentinel rewrites its file: one each
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", f"dir {self.logs}",
            f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2",
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER} 1", ""]))
        self.sentinels[port] = spawn(f"sentinel-{port}", [redis_server_binary(), str(conf), "--sentinel"], self.logs)
        wait_for(lambda: redis.Redis(port=port, socket_timeout=2).ping(), 20, f"sentinel on {port}",
                 self.sentinels[port])

    def _settled(self) -> bool:
        for port in self.sentinels:
            master = redis.Redis(port=port, socket_timeout=2).sentinel_master(MASTER)
            if int(master["num-slaves"]) < self.replicas or int(master["num-other-sentinels"]) < 2:
                return False
        return True
