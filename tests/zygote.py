"""The tests' Python processes, as real processes that skip Python's start-up imports.

Why: the tests start `python -m producer ...` a few hundred times, and Celery workers and SGLang
stand-ins a few hundred more; each of them spent most of its start-up CPU importing (typer and
rich 0.5 CPU-s, transformers 1.3 more in every producer command that renders prompts, Celery's
CLI and the worker's libraries 1 CPU-s): a third of the whole suite's CPU on 2 cores.

How: one zygote per pytest worker, a process that has imported the libraries these programs use
(never the project's own modules: it drops them again, so each program imports them fresh and
reads its environment as a new process would) and runs no thread. For each program it forks a
child, which takes the program's argv, environment, working directory, standard streams (and, as
`start_new_session`, a session of its own), and runs `python -m MODULE` (runpy, as `-m` does): a
separate process, that exits through the interpreter's own shutdown with its own exit status. The
zygote reports the child's pid, then its exit status once it ended; signals go to the pid.

The real SGLang server's launcher (`tests/real_sglang.py`) has a zygote of its own, of SGLang's
interpreter, that has imported SGLang (~10 CPU-s, paid once rather than in every load).

Run as `python tests/zygote.py SOCKET [KIND]` (KIND: `fleet`, the default, or `sglang`); `Zygote` below
starts one and speaks to it.
"""
from __future__ import annotations

import gc
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_PACKAGES = ("producer", "contract", "workers", "sglang_standin")


# ---- the zygote process

# What the frequent producer commands (enqueue, status, dead), the stand-in and a worker import.
# Not pyarrow (export, show, report, S3 output, the worker's shards): it starts threads of its own
# when imported.
PRELOAD = ("producer.cli", "producer.enqueue", "producer.status", "producer.status_view", "producer.dead",
           "contract.broker.config", "contract.chat.template", "contract.ledger.deadletters", "contract.settings",
           "celery", "celery.app.amqp", "kombu.transport.redis", "jinja2.sandbox",
           "sglang_standin.cli", "sglang_standin.runner",
           "celery.bin.celery", "celery.apps.worker", "celery.concurrency.thread", "celery.worker.consumer",
           "httpx", "flower", "prometheus_client")


# What the real SGLang server's launcher imports before it loads a model: all of SGLang's server, torch and
# transformers. Its zygote runs with the server's own environment (`tests/real_sglang.py`), which SGLang reads
# when imported.
SGLANG_PRELOAD = ("sglang.launch_server", "sglang.srt.entrypoints.http_server")


def _preload(kind: str) -> None:
    """Import what the programs import, then drop the project's own modules (a program imports
    them fresh, reading its own environment). The environment is the zygote's own again
    afterwards; while importing it has what a program would have set before these imports
    (contract.chat.template's defaults for transformers, whose logging reads them when imported), and
    OPENBLAS_NUM_THREADS=1: numpy (imported by transformers) would otherwise start OpenBLAS's
    thread pool, and a process with threads must not fork. None of the programs multiplies
    matrices. Libraries that read the environment when imported read the pytest worker's: the
    tests vary only variables the project reads (FLEET_*, SGLANG_*, REDIS_URL, OUTPUT_DIR, AWS_*,
    COLUMNS, which rich reads when producer.cli, imported fresh, builds its consoles)."""
    import importlib

    if kind == "sglang":
        for name in SGLANG_PRELOAD:
            importlib.import_module(name)
        return
    saved = dict(os.environ)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for name in PRELOAD:
        importlib.import_module(name)
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (the bundled tokenizer's class)
    for name in [n for n in sys.modules if n.split(".")[0] in PROJECT_PACKAGES]:
        del sys.modules[name]
    os.environ.clear()
    os.environ.update(saved)


def serve(path: str, kind: str = "fleet") -> dict | None:
    """Start programs until stdin closes (the test worker ended). Returns only in a forked
    child: the program it is to become, its standard streams already in place."""
    _preload(kind)
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:  # a thread would not survive fork()
        raise SystemExit(f"zygote: {len(threads)} threads after the imports; fork() is unsafe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    # The imported objects are never collected: a child's collections and its exit leave their pages
    # shared (without this, a producer command's exit alone cost 0.4 CPU-s of copied pages).
    gc.freeze()
    print("ready", flush=True)
    running: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (connection, pid)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":  # the test worker is gone: so is the zygote
                return None
            if key.data == "accept":
                connection, _ = listener.accept()
                request, fds = _receive(connection)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other, *_ in running.values():
                        other.close()
                    for pidfd in running:
                        os.close(pidfd)
                    connection.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    return request
                for fd in fds:
                    os.close(fd)
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                pidfd = os.pidfd_open(pid)
                _started[pid] = (request["module"], request["args"][:2], time.monotonic(),
                                 request["env"].get("PYTEST_CURRENT_TEST", ""))
                running[pidfd] = (connection, pid)
                selector.register(pidfd, selectors.EVENT_READ, "child")
            else:  # a child ended
                pidfd = key.fd
                connection, pid = running.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status, usage = os.wait4(pid, 0)
                _account(pid, usage)
                try:
                    connection.sendall(json.dumps({"returncode": _returncode(status)}).encode() + b"\n")
                except OSError:
                    pass  # the client gave up on it
                connection.close()


_started: dict[int, tuple] = {}


def _account(pid: int, usage) -> None:
    module, args, since, test = _started.pop(pid)
    log = os.environ.get("FLEET_TEST_CPU_LOG")
    if log:
        with open(log, "a") as out:
            out.write(json.dumps({"module": module, "args": args, "cpu": usage.ru_utime + usage.ru_stime,
                                  "wall": time.monotonic() - since,
                                  "test": test}) + "\n")


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 20)
        if not more:
            raise EOFError("zygote: request cut short")
        data += more
    return json.loads(data), fds


def _returncode(status: int) -> int:
    """As subprocess reports it: the exit code, or minus the signal that ended the process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def run_command(request: dict) -> None:
    """In the child: become `python -m MODULE ARGS` in the request's environment and folder."""
    import runpy

    if request["session"]:
        os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` puts it
    sys.argv = ["-m", *request["args"]]  # runpy sets argv[0] to the module's file, as -m does
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# ---- the test side

class Zygote:
    """A zygote started for this test worker: `run` is `subprocess.run` for producer commands,
    `start` Popen for any `python -m MODULE`, `spawn` producer.local's spawn.

    A program whose PYTHON* variables differ from the zygote's (a PYTHONPATH with a
    sitecustomize of its own, as tests/intake/test_clock_skew.py gives its workers) needs an interpreter
    that starts with them: it is started as a plain subprocess."""

    def __init__(self, folder: Path, env: dict[str, str], cwd: Path, python: str = sys.executable,
                 kind: str = "fleet"):
        self.folder, self.env, self.python = folder, dict(env), python
        folder.mkdir(parents=True, exist_ok=True)
        self.path = str(folder / "zygote.sock")
        self.log = folder / "zygote.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([python, __file__, self.path, kind], env=env, cwd=cwd,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        line = self.process.stdout.readline()
        if line.strip() != b"ready":
            self.process.kill()
            raise RuntimeError(f"zygote did not start: {self.log.read_text()[-2000:]}")

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """`python -m producer ARGS` run to its end, its output captured as text."""
        started = self.start("producer", args, env, cwd)
        stdout, stderr = started.communicate(timeout=timeout)
        return subprocess.CompletedProcess(started.args, started.returncode, stdout, stderr)

    def start(self, module: str, args: list[str], env: dict[str, str], cwd: Path,
              output: int | None = None, session: bool = False) -> "Command | subprocess.Popen":
        """`python -m MODULE ARGS` started: its stdout and stderr to `output` (a file descriptor),
        else captured (as text) for `communicate`."""
        if self._forkable(env):
            return Command(self.path, module, args, env, cwd, output, session)
        streams = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if output is None else \
            dict(stdout=output, stderr=output)
        return subprocess.Popen([self.python, "-m", module, *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                start_new_session=session, **streams)

    def spawn(self, name: str, argv: list[str], logs: Path, env: dict | None = None):
        """producer.local.spawn for `python -m MODULE` programs (any other argv is spawned as
        ever). Without `env`, the zygote's own: the test worker's, and PYTHONPATH=ROOT."""
        from producer.local import Process, spawn

        if argv[:2] != [self.python, "-m"]:
            return spawn(name, argv, logs, env)
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with open(log, "ab") as handle:
            started = self.start(argv[2], argv[3:], dict(self.env if env is None else env), Path.cwd(),
                                 output=handle.fileno(), session=True)
        return Process(name, started, log)

    def _forkable(self, env: dict[str, str]) -> bool:
        return _python_variables(env) == _python_variables(self.env)

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Command:
    """A started program: what the tests use of Popen (pid, returncode, poll, wait, communicate,
    send_signal, kill)."""

    def __init__(self, path: str, module: str, args: list[str], env: dict[str, str], cwd: Path,
                 output: int | None, session: bool):
        self.args = ["-m", module, *args]
        self.returncode: int | None = None
        self._captured = None
        if output is None:
            self._captured = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            fds = [f.fileno() for f in self._captured]
        else:
            fds = [output, output]
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(path)
        self._received = b""
        request = {"module": module, "args": list(args), "env": env, "cwd": str(cwd), "session": session}
        with open(os.devnull, "rb") as stdin:
            socket.send_fds(self._socket, [json.dumps(request).encode() + b"\n"], [stdin.fileno(), *fds])
        self.pid = self._reply(None)["pid"]

    def _reply(self, timeout: float | None) -> dict:
        self._socket.settimeout(timeout)
        while b"\n" not in self._received:
            try:
                more = self._socket.recv(4096)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not more:
                raise RuntimeError("the zygote closed the connection without an answer")
            self._received += more
        line, self._received = self._received.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._reply(timeout)["returncode"]
            self._socket.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        return tuple(_text(f) for f in self._captured)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may be another process's now
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _python_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


def _text(file) -> str:
    """What subprocess's text mode reads from a pipe: the locale's encoding, universal newlines."""
    file.seek(0)
    data = file.read().decode(locale.getpreferredencoding(False))
    file.close()
    return data.replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    command = serve(sys.argv[1], *sys.argv[2:3])
    if command is not None:
        run_command(command)
