"""deploy/ against real processes: the dashboard's and the alerts' metrics on a real
worker's /metrics, and a Slurm node's drain (tests/specs/test_deploy.py has the offline checks)."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from producer.local import free_port
from tests.conftest import varied_prompts, wait_until, write_prompts
from tests.specs.test_deploy import SLURM, alert_queries, dashboard_queries, promql

ROOT = Path(__file__).resolve().parents[1]


def test_every_fleet_metric_the_dashboard_and_alerts_use_is_on_a_real_workers_page(fleet, tmp_path):
    # Given a worker serving /metrics after a run with stored samples, a dead letter and a retry
    _, url = fleet.standin("--fault-empty-answer", "0.2", "--fault-http500-first", "0.2")
    port = free_port()
    fleet.worker("w1", [url], FLEET_METRICS_PORT=str(port))
    wait_until(lambda: _page(port), 60, "the worker's /metrics", fleet)
    before = promql.Scrape.of(_page(port), at=0.0)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(30))))
    fleet.wait_finished()
    after = promql.Scrape.of(_page(port), at=60.0)

    # Then every fleet_* metric a dashboard query or an alert names is there, with its labels
    missing = []
    for where, query in dashboard_queries() + alert_queries():
        for name, labels in promql.selectors(query):
            if not name.startswith("fleet_"):
                continue
            series = after.series.get(name)
            if not series:
                missing.append(f"{where}: {name}")
                continue
            have = set().union(*(s.keys() for s, _ in series))
            lacking = labels - promql.TARGET_LABELS - have
            if lacking:
                missing.append(f"{where}: {name} has no label {sorted(lacking)} (has {sorted(have)})")
    assert not missing, "\n".join(missing)
    # and every query evaluates over the two scrapes (the table in docs/operate/prometheus-grafana.md is made this way)
    values = {q: promql.evaluate(q, before, after) for _, q in dashboard_queries() + alert_queries()}
    stored = values['sum by (outcome) (rate(fleet_prompts_total{job=~"$job", run=~"$run"}[$__rate_interval]))']
    assert sum(v for _, v in stored) * 60 == 30  # 30 prompts finished between the scrapes


def _page(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None


def test_a_slurm_node_drains_its_worker_before_stopping_its_server(fleet, tmp_path):
    # Given fleet-node.sh with the stand-in as its server: slow generations, two at a time
    port = free_port()
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # celery, as after `activate`
    env = fleet.env(SGLANG_PORT=str(port), RUN_DIR=str(tmp_path / "run"), FLEET_SHUTDOWN_GRACE="60", PATH=path,
                    SGLANG_CMD=f"{shlex.quote(sys.executable)} -m sglang_standin --port {port} "
                               "--fault-slow 1.0 --slow-seconds 3 --max-running-requests 2")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(12))))
    node = subprocess.Popen([str(SLURM / "fleet-node.sh")], env=env, cwd=ROOT, start_new_session=True)
    try:
        wait_until(lambda: fleet.states().get("done", 0) >= 1, 120, "the node's worker storing a sample", fleet)
        # When Slurm's --signal reaches the node's task
        done_at_signal = fleet.states().get("done", 0)
        node.send_signal(signal.SIGTERM)
        # Then the worker drains and exits 0, and only then the server stops
        assert node.wait(timeout=120) == 0
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
    log = (tmp_path / "run" / "logs").glob("worker-*.log")
    text = "".join(p.read_text() for p in log)
    assert "finishing in-flight prompts" in text
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    # and the generations in flight at the signal finished, on a server still up
    states = fleet.states()
    assert states.get("done", 0) > done_at_signal
    # and every prompt is stored or back in the queue, none lost
    assert states.get("done", 0) + states.get("queued", 0) == 12 and states.get("dead", 0) == 0
