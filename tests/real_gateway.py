"""SGLang's real gateway (sglang-router, installed by scripts/setup.sh in .venv-router) as a test process.

The gateway is the package from the index, not a stand-in: a Rust binary that
needs no GPU, put in front of SGLang stand-ins. Its traffic stays on loopback:
it fetches the tokenizer of the model its workers report from the Hugging Face
hub at start (for its OpenAI routes, which the fleet does not use), so
`HF_ENDPOINT` points at a closed loopback port and that fetch fails at once.
`FLEET_SGLANG_ROUTER_PYTHON` names another interpreter that has the package.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

from producer.local import Process, free_port, spawn, wait_for

ROOT = Path(__file__).resolve().parents[1]


def router_python() -> str:
    found = os.environ.get("FLEET_SGLANG_ROUTER_PYTHON") or str(ROOT / ".venv-router" / "bin" / "python")
    if not Path(found).exists():
        raise AssertionError(f"{found} not found: scripts/setup.sh installs sglang-router there")
    return found


@dataclass
class Gateway:
    process: Process
    url: str
    metrics: str  # its Prometheus endpoint: the circuit breakers' states and transitions
    workers: list[str]  # the servers it was started in front of

    def circuits_opened(self) -> int:
        """How many times a worker's circuit went from closed to open (smg_worker_cb_transitions_total)."""
        text = httpx.get(self.metrics, timeout=5).text
        return sum(int(float(v)) for v in re.findall(
            r'^smg_worker_cb_transitions_total\{[^}]*from="closed"[^}]*to="open"[^}]*\} (\S+)$', text, re.M))

    def open_circuits(self, requests: int = 200) -> None:
        """What another client can do: requests the workers refuse (400: a budget beyond any context)
        until every circuit is open and the gateway answers 503 No available workers."""
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 10**7}}
        for _ in range(requests):
            answer = httpx.post(f"{self.url}/generate", json=body, timeout=30)
            if answer.status_code == 503:
                return
        outcomes = [line for line in httpx.get(self.metrics, timeout=5).text.splitlines() if "_cb_" in line]
        raise AssertionError(f"the gateway's circuits did not open after {requests} refused requests (last: "
                             f"{answer.status_code} {answer.text[:200]}); its breakers: {outcomes}")


def start_gateway(logs: Path, workers: list[str], *options: str, policy: str = "cache_aware",
                  port: int | None = None) -> Gateway:
    """`python -m sglang_router.launch_router` in front of `workers`, ready (its /readiness 200), on
    `port` (a free one if None: a restarted gateway comes back on its own).
    A 1 s health check interval (the default is 60 s) so that a killed worker leaves its list soon."""
    port, metrics = port or free_port(), free_port()
    argv = [router_python(), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics), "--health-check-interval-secs", "1", "--shutdown-grace-period-secs", "1",
            "--log-level", "warn",
            *options]
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(logs / "hf-home"),
           "NO_COLOR": "1"}
    process = spawn(f"gateway-{port}", argv, logs, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(f"{url}/readiness", timeout=5).status_code == 200, 60, "sglang-router", process)
    return Gateway(process, url, f"http://127.0.0.1:{metrics}/metrics", list(workers))
