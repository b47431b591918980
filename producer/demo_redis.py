"""The demo's Redis: append-only, its data under the demo's folder, running after the demo.

So the commands the demo prints at its end (`status`, `dead list`, `show`,
`export` ...) reach the demo's run, not whatever Redis answers on the default
port. Its address and process id are kept beside its data (`server.json`); the
next demo stops it (only a process that is still that server: its pid, and
its URL answering) and starts afresh.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import redis

from .local import start_redis

RECORD = "server.json"


def start(workdir: Path, logs: Path) -> dict:
    """Stop the previous demo's Redis, wipe its data, start a new one; its record."""
    folder = workdir / "redis"
    stop(folder)
    shutil.rmtree(folder, ignore_errors=True)
    process, url = start_redis(logs, data_dir=folder, appendonly=True, fsync="everysec")
    kept = {"url": url, "pid": process.popen.pid, "dir": str(folder)}
    (folder / RECORD).write_text(json.dumps(kept))
    return kept


def stop(folder: Path) -> None:
    """Stop the server `folder` records, if it is still running there."""
    try:
        kept = json.loads((folder / RECORD).read_text())
        redis.Redis.from_url(kept["url"], socket_timeout=2).ping()
    except (OSError, ValueError, KeyError, redis.RedisError):
        return  # none recorded, or no longer answering
    try:
        os.kill(kept["pid"], signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(kept["pid"], 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
