"""The real SGLang server (the package from the index, its CPU engine) as a test process.

`scripts/setup.sh` builds SGLang's environment once into a cache folder that
later runs and fresh clones on the same machine reuse
(`~/.cache/reasoning-fleet/sglang-<version>`, or `FLEET_SGLANG_VENV`);
`FLEET_SGLANG_PYTHON` names another interpreter that has SGLang. Everything the
server runs is stock SGLang but one kernel module (`tests/sglang_cpu/sgl_kernel`).

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
from dataclasses import dataclass
from pathlib import Path

import httpx

from producer.local import Process, free_port, spawn, wait_for

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.5.23"  # the SGLang the fleet is tested with (scripts/setup.sh installs it)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reasoning-fleet"
KERNEL = ROOT / "tests" / "sglang_cpu"
CONTEXT = 4096
START_TIMEOUT = 240  # seconds: ~30 s alone, several times that beside a busy suite on 2 cores

THINK_START, THINK_END, EOS, ASSISTANT = 128821, 128822, 1, 128804
# The trace model's answers, as text; tests/sglang_cpu/make_model.py refuses ids that would repeat.
REASONING = "First count each apple, then sum everything carefully."
ANSWER = "The total is twelve!"


STARTED: list["RealServer"] = []  # every server this pytest process started (tests/conftest.py stops them)


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
    (its /health 200) unless `wait_healthy` is False."""
    if port is None and wait_healthy:  # a fresh port when the first one was taken meanwhile
        return wait_healthy_or_again(logs, start_sglang(logs, model, *options, port=free_port(), wait_healthy=False))
    port = port or free_port()
    # niced: the suite's timing-bound tests (failover lags, leases) run beside it on two cores
    argv = ["nice", "-n", "10", sglang_python(), "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "torch_native",
            "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
            "--max-total-tokens", "16384", "--skip-server-warmup", "--sleep-on-idle", *options]
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(KERNEL), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = spawn(f"sglang-{port}", argv, logs, env=env)
    server = RealServer(process, f"http://127.0.0.1:{port}", model, port, tuple(options))
    STARTED.append(server)  # listed before any wait, so a test cut short still stops it
    if wait_healthy:
        wait_healthy_server(server)
    return server


def wait_healthy_server(server: RealServer, timeout: float = START_TIMEOUT) -> None:
    wait_for(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200, timeout,
             f"SGLang {VERSION} on port {server.port}", server.process)


def wait_healthy_or_again(logs: Path, server: RealServer) -> RealServer:
    """`server` once healthy; or, when it lost its port at start (`RealServer.lost_its_port`), the
    same server started again on another port, healthy. Only for a server whose port nobody chose."""
    try:
        wait_healthy_server(server)
        return server
    except RuntimeError:
        if not server.lost_its_port():
            raise
    return start_sglang(logs, server.model, *server.options, port=free_port())


def restart(logs: Path, server: RealServer, wait_healthy: bool = True) -> RealServer:
    """The same server started again on its port, with its model and options."""
    return start_sglang(logs, server.model, *server.options, port=server.port, wait_healthy=wait_healthy)
