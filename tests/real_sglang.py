"""The real SGLang server (the package from the index, its CPU engine) as a test process.

`scripts/setup.sh` builds SGLang's environment once into a cache folder that
later runs and fresh clones on the same machine reuse
(`~/.cache/reasoning-fleet/sglang-<version>`, or `FLEET_SGLANG_VENV`);
`FLEET_SGLANG_PYTHON` names another interpreter that has SGLang. Everything the
server runs is stock SGLang but one kernel module (`tests/sglang_cpu/sgl_kernel`), its engine's
processes forked rather than spawned (`tests/sglang_cpu/launch_server.py`: a third less CPU a load),
and its launcher forked from a zygote of SGLang's interpreter that imported SGLang once
(`tests/zygote.py`: ~10 CPU-seconds less a load).

Two tiny checkpoints whose vocabulary is the bundled tokenizer's, written by
`tests/sglang_cpu/make_model.py` once into the same cache:
- `random`: random weights, real attention over the whole prompt;
- `trace`: weights that make it answer a chosen trace by the prompt's last
  token: after `<think>` (the bundled template's generation prompt) it reasons,
  closes with `</think>`, answers and stops on EOS; after `<｜Assistant｜>` (a
  template without thinking) it answers and stops. Every other last token
  follows the reasoning chain.

A server is its launcher's whole process group (HTTP server, tokenizer
manager, scheduler, detokenizer), so `kill` ends all of it at once, as an
out-of-memory kill or a crash of the node would.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from producer.local import Process, free_port

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.5.23"  # the SGLang the fleet is tested with (scripts/setup.sh installs it)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reasoning-fleet"
KERNEL = ROOT / "tests" / "sglang_cpu"
CONTEXT = 4096
# A load takes ~19 CPU-seconds of its processes (forked from the zygote: `_launcher`); one that has
# spent nine times that without answering /health is stuck. Wall time alone says little here: beside a busy
# suite on 2 cores a load gets a fraction of a core.
START_CPU_SECONDS = 180
START_TIMEOUT = 600  # seconds from its launch, whatever it spent
SERVING_NICE = 10  # once loaded: the suite's timing-bound tests (failover lags, leases) run beside it on 2 cores
# One server loads at a time on this machine, whichever pytest process (or fresh clone) starts it: a load is
# ~19 CPU-seconds in three processes, so loads side by side only stretch each other past their
# timeout on 2 cores (and hold ~4 GB each while they do). Held from launch until healthy, exited or timed out.
START_GATE = CACHE / "sglang-start.lock"
# Real servers alive at once on this machine (~2.8 GB each, proportional set size): a start waits for a slot.
# xdist's groups keep this suite's to three, but fresh clones and other pytest runs share the machine.
SERVER_SLOTS = 4
SLOTS = CACHE / "sglang-slots"
_held_slots: dict[int, object] = {}  # port -> the slot its server holds, kept across a kill and a restart there

THINK_START, THINK_END, EOS, ASSISTANT = 128821, 128822, 1, 128804
# The trace model's answers, as text; tests/sglang_cpu/make_model.py refuses ids that would repeat.
REASONING = "First count each apple, then sum everything carefully."
ANSWER = r"So the total is \boxed{12}."  # a math answer, for verifiers (`enqueue --verify math`)


STARTED: list["RealServer"] = []  # every server this pytest process started (tests/conftest.py stops them)
_zygote: list = []  # this pytest process's SGLang zygote, started at its first load (`_launcher`)


def sglang_python() -> str:
    found = os.environ.get("FLEET_SGLANG_PYTHON") or str(
        Path(os.environ.get("FLEET_SGLANG_VENV", CACHE / f"sglang-{VERSION}")) / "bin" / "python")
    if not Path(found).exists():
        raise AssertionError(f"{found} not found: scripts/setup.sh installs SGLang {VERSION} there")
    return found


def trace_chains(tokenizer) -> dict:
    """The trace model's chains, as ids of `tokenizer` (the bundled one)."""
    reasoning = tokenizer.encode(REASONING, add_special_tokens=False)
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    return {"chains": [{"after": [THINK_START], "emit": [*reasoning, THINK_END, *answer, EOS]},
                       {"after": [ASSISTANT], "emit": [*answer, EOS]}]}


def expected_trace(tokenizer, thinking: bool) -> list[int]:
    """What the trace model answers after the bundled template's generation prompt (thinking), or
    after a template that ends with the assistant's tag (not)."""
    chains = trace_chains(tokenizer)["chains"]
    return chains[0 if thinking else 1]["emit"]


def checkpoint(kind: str, tokenizer_dir: Path, tokenizer=None, vocab: int | None = None) -> Path:
    """The `random` or `trace` checkpoint, written once into the cache (one writer at a time); `vocab`
    gives a random model fewer ids than its tokenizer (the ids above kill the engine)."""
    chains = json.dumps(trace_chains(tokenizer)) if kind == "trace" else ""
    builder = (KERNEL / "make_model.py").read_bytes()
    files = b"".join((tokenizer_dir / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")
                     if (tokenizer_dir / name).exists())
    digest = hashlib.sha256(builder + chains.encode() + files + str(vocab).encode()).hexdigest()[:12]
    target = CACHE / "sglang-models" / f"{kind}-{digest}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            argv = [sglang_python(), str(KERNEL / "make_model.py"), str(target), "--tokenizer", str(tokenizer_dir),
                    "--context", str(CONTEXT)]
            if vocab:
                argv += ["--vocab", str(vocab)]
            if chains:
                spec = target.parent / f"{target.name}.chains.json"
                spec.write_text(chains)
                argv += ["--trace", str(spec)]
            subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return target


def tokenizer_with_added_tokens(base, folder: Path, tokens: list[str]) -> Path:
    """`base` (a transformers tokenizer) with `tokens` added after its vocabulary, saved to `folder`:
    what a run enqueued with a fine-tuned model's tokenizer sends to a server of the base model."""
    import copy

    extended = copy.deepcopy(base)
    extended.add_tokens(tokens, special_tokens=True)
    extended.save_pretrained(str(folder))
    return folder


@dataclass
class RealServer:
    process: Process
    url: str
    model: Path
    port: int
    options: tuple[str, ...]

    def kill(self) -> None:
        """SIGKILL to every process of the server at once."""
        _signal_group(self.process, signal.SIGKILL)
        self.process.popen.wait(10)

    def stop(self) -> None:
        _signal_group(self.process, signal.SIGTERM)
        try:
            self.process.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
        self.release()

    def bury(self) -> None:
        """What is left of a dead server's process group killed, and its slot given up."""
        self.kill()
        self.release()

    def release(self) -> None:
        """Its slot (`SERVER_SLOTS`) given up: it is stopped and not started again on its port."""
        slot = _held_slots.pop(self.port, None)
        if slot is not None:
            slot.close()

    def lost_its_port(self) -> bool:
        """It exited at start because its port was taken: free_port() found the port free, but a
        server binds it only after loading (~30-80 s), and in that while an outgoing connection of
        any process on the machine (a busy, shared one) may take it as its ephemeral port."""
        return not self.process.alive() and "address already in use" in self.process.tail(200)

    def generate(self, input_ids: list[int], **sampling) -> dict:
        """The server's own answer to these ids (what a sample must equal)."""
        body = {"input_ids": input_ids, "sampling_params": sampling}
        answer = httpx.post(f"{self.url}/generate", json=body, timeout=120)
        answer.raise_for_status()
        return answer.json()


def _signal_group(process: Process, sig: int) -> None:
    try:
        os.killpg(process.popen.pid, sig)
    except ProcessLookupError:
        pass


def start_sglang(logs: Path, model: Path, *options: str, port: int | None = None,
                 wait_healthy: bool = True) -> RealServer:
    """`python -m sglang.launch_server` on its CPU engine, on `port` (a free one if None), healthy
    (its /health 200) unless `wait_healthy` is False. Launched once no other server on the machine is
    loading (`START_GATE`), at normal priority, and niced (`SERVING_NICE`) once loaded."""
    if port is None and wait_healthy:  # a fresh port when the first one was taken meanwhile
        return wait_healthy_or_again(logs, start_sglang(logs, model, *options, port=free_port(), wait_healthy=False))
    port = port or free_port()
    _take_slot(port)
    gate = _enter_start_gate()
    try:
        argv = [sglang_python(), "-m", "launch_server", "--model-path", str(model), "--device", "cpu",
                "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "torch_native",
                "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
                "--max-total-tokens", "16384", "--skip-server-warmup", "--sleep-on-idle", *options]
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(KERNEL), "HF_HUB_OFFLINE": "1",
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        process = _launcher(env).spawn(f"sglang-{port}", argv, logs, env=env)
    except BaseException:
        gate.close()
        raise
    server = RealServer(process, f"http://127.0.0.1:{port}", model, port, tuple(options))
    STARTED.append(server)  # listed before any wait, so a test cut short still stops it
    threading.Thread(target=_leave_start_gate_when_loaded, args=(server, gate), daemon=True,
                     name=f"sglang-{port}-loading").start()
    if wait_healthy:
        wait_healthy_server(server)
    return server


def _launcher(env: dict[str, str]):
    """This pytest process's zygote of SGLang's interpreter (`tests/zygote.py`, kind `sglang`), started with
    the servers' own environment (SGLang reads some of it when imported): each launch is forked from it."""
    if not _zygote:
        from zygote import Zygote

        _zygote.append(Zygote(Path(tempfile.mkdtemp(prefix="sglang-zygote-")), env, KERNEL, python=sglang_python(),
                              kind="sglang"))
    return _zygote[0]


def close_launcher() -> None:
    """The zygote gone (after every server it started was stopped: tests/conftest.py)."""
    while _zygote:
        _zygote.pop().close()


def _take_slot(port: int) -> None:
    if port in _held_slots:  # a server started again on its port
        return
    SLOTS.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(SERVER_SLOTS):
            slot = open(SLOTS / f"{index}.lock", "w")
            try:
                fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                slot.close()
                continue
            _held_slots[port] = slot
            return
        time.sleep(1)


def _enter_start_gate():
    START_GATE.parent.mkdir(parents=True, exist_ok=True)
    gate = open(START_GATE, "w")
    fcntl.flock(gate, fcntl.LOCK_EX)  # bounded by the loads ahead, each by START_TIMEOUT
    return gate


def _leave_start_gate_when_loaded(server: RealServer, gate) -> None:
    """The gate opened for the next server once this one answers /health, exits or runs out of time; niced
    from then on (every process of its group, threads included)."""
    try:
        try:
            wait_healthy_server(server)
        except (RuntimeError, TimeoutError):
            pass  # the test waiting on it says so
        try:
            os.setpriority(os.PRIO_PGRP, server.process.popen.pid, SERVING_NICE)
        except OSError:
            pass  # gone already
    finally:
        gate.close()


def _healthy(server: RealServer) -> bool:
    try:
        return httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy_server(server: RealServer) -> None:
    """Until its /health answers 200; RuntimeError when it exits, TimeoutError when it has spent
    `START_CPU_SECONDS` of CPU (or `START_TIMEOUT` seconds) without."""
    what = f"SGLang {VERSION} on port {server.port}"
    launched = time.monotonic()
    while not _healthy(server):
        if not server.process.alive():
            raise RuntimeError(f"{what} exited:\n{server.process.tail()}")
        spent, waited = _group_cpu_seconds(server.process.popen.pid), time.monotonic() - launched
        if spent > START_CPU_SECONDS or waited > START_TIMEOUT:
            raise TimeoutError(f"{what} not ready after {waited:.0f}s and {spent:.0f} CPU-seconds:\n"
                               f"{server.process.tail(20)}")
        time.sleep(0.5)


def _group_cpu_seconds(group: int) -> float:
    """CPU time (user and system) of the live processes of a process group, from /proc."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == group:  # fields after the name: state ppid pgrp ... utime(11) stime(12)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_healthy_or_again(logs: Path, server: RealServer) -> RealServer:
    """`server` once healthy; or, when it lost its port at start (`RealServer.lost_its_port`), the
    same server started again on another port, healthy. Only for a server whose port nobody chose."""
    try:
        wait_healthy_server(server)
        return server
    except RuntimeError:
        if not server.lost_its_port():
            raise
    server.release()
    return start_sglang(logs, server.model, *server.options, port=free_port())


def restart(logs: Path, server: RealServer, wait_healthy: bool = True) -> RealServer:
    """The same server started again on its port, with its model and options."""
    return start_sglang(logs, server.model, *server.options, port=server.port, wait_healthy=wait_healthy)


class SharedServers:
    """Real servers kept alive across the tests of one pytest process (an xdist group's tests run in one),
    each by its model, options and copy number: a load is ~19 CPU-seconds and 40-200 s of a 2-core machine,
    so a server a test leaves running serves the next test that asks for the same one. A test may kill the
    one it got (a gateway's server dying mid-run): the next to ask gets it started again.

    At most `limit` alive at once in this process (each holds ~3 GB); the one asked for longest ago is
    stopped to make room. Only tests that run one after another share them: a server is never stopped
    under the test that holds it, since this process runs one test at a time and asks before it starts."""

    def __init__(self, logs: Path, limit: int):
        self.logs, self.limit = logs, limit
        self._servers: dict[tuple, RealServer] = {}  # the one asked for longest ago first
        self._starts = 0

    def get(self, model: Path, *options: str, copy: int = 0) -> RealServer:
        """The live server of `model` with `options` (its `copy`-th, for two alike), started if it is not."""
        key = (str(model), options, copy)
        server = self._servers.pop(key, None)
        if server is not None and not server.process.alive():
            server.bury()
            server = None
        if server is None:
            self.make_room(self.limit - 1)
            self._starts += 1
            server = start_sglang(self.logs / f"{model.name}-{self._starts}", model, *options)
        self._servers[key] = server
        return server

    def make_room(self, keep: int) -> None:
        """Servers stopped, longest unasked first, until at most `keep` are alive."""
        for key, server in list(self._servers.items()):
            if not server.process.alive():
                self._servers.pop(key).bury()
        while len(self._servers) > keep:
            self._servers.pop(next(iter(self._servers))).stop()

    def holds(self, server: RealServer) -> bool:
        return any(server is held for held in self._servers.values())

    def stop_all(self) -> None:
        self.make_room(0)
