"""The Celery app takes its task-event switch from `FLEET_TASK_EVENTS` (on unless told)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, sent", [(None, "True"), ("false", "False"), ("true", "True")])
def test_task_events_are_sent_unless_switched_off(value, sent):
    env = {k: v for k, v in os.environ.items() if k != "FLEET_TASK_EVENTS"}
    if value is not None:
        env["FLEET_TASK_EVENTS"] = value
    code = "from workers.celery import app; print(app.conf.worker_send_task_events)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == sent
