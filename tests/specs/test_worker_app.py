"""The Celery app's switches: task events (`FLEET_TASK_EVENTS`, on unless told), Celery's own
per-task log lines (`FLEET_TASK_LOG`, off unless told), and the group commit's size."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _app_prints(code: str, name: str, value: str | None) -> str:
    """What `code` prints once `workers.celery` is imported with env `name` set to `value`."""
    env = {k: v for k, v in os.environ.items() if k != name}
    if value is not None:
        env[name] = value
    out = subprocess.run([sys.executable, "-c", f"from workers.celery import app; {code}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("value, sent", [(None, "True"), ("false", "False"), ("true", "True")])
def test_task_events_are_sent_unless_switched_off(value, sent):
    assert _app_prints("print(app.conf.worker_send_task_events)", "FLEET_TASK_EVENTS", value) == sent


@pytest.mark.parametrize("value, quiet", [(None, "True"), ("false", "True"), ("true", "False")])
def test_celerys_two_lines_a_task_are_logged_only_when_asked_for(value, quiet):
    # (the worker's -l sets the level of every other logger; these two are held at WARNING)
    code = ("import logging; print(all(logging.getLogger(n).level == logging.WARNING "
            "for n in ('celery.app.trace', 'celery.worker.strategy')))")
    assert _app_prints(code, "FLEET_TASK_LOG", value) == quiet


@pytest.mark.parametrize("env, rows", [
    ({}, 1000),                                                      # 2 x 1024 threads: the shard size
    ({"max_inflight_per_server": 16}, 16),                           # 32 threads: half of them
    ({"concurrency": 8, "shard_max_rows": 1000}, 4),
    ({"concurrency": 4000, "shard_max_rows": 500}, 500),
    ({"concurrency": 1}, 1),
])
def test_a_group_commit_is_due_when_half_the_threads_wait_for_it_or_the_shard_is_full(env, rows):
    from workers.settings import Settings

    assert Settings(sglang_urls="http://a", **env).group_rows == rows
