"""Importing the fleet changes nothing of kombu, Celery or redis-py (`workers/intake/transport.py`,
`workers/reporting/heart.py`: the worker extends them by subclassing, selected through their own
settings). Checked in a fresh interpreter: every attribute of every kombu, Celery and redis-py module
and class is recorded (by identity) before the fleet is imported and compared after."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SNAPSHOT = r'''
import importlib, json, sys

LIBRARIES = ("kombu", "celery", "redis", "flower")

def snapshot():
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in LIBRARIES:
            continue
        for attr, value in list(vars(module).items()):
            found[f"{name}.{attr}"] = value
            if isinstance(value, type) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    found[f"{name}.{attr}.{cattr}"] = cvalue
    return found

# the library modules the fleet builds on, loaded as a worker loads them
for name in ("kombu", "kombu.connection", "kombu.transport", "kombu.transport.redis", "kombu.transport.virtual.base",
             "celery", "celery.bootsteps", "celery.worker.consumer", "celery.worker.consumer.heart",
             "celery.worker.heartbeat", "celery.events.dispatcher", "redis", "redis.client", "redis.connection",
             "redis.sentinel", "redis.retry", "flower", "flower.app"):
    importlib.import_module(name)
before = snapshot()

# the fleet: the workers package, the worker's Celery app (Flower's too), the producer's CLI and app
import workers, producer.cli
from workers.celery import app
from contract.broker.config import celery_app
celery_app("redis://127.0.0.1:1/0")
connection = app.connection_for_read()
transport_cls = connection.get_transport_cls()

after = snapshot()
MISSING = object()
changed = sorted(key for key, value in before.items() if after.get(key, MISSING) is not value)
# a new attribute of a module or class that was there before: a submodule imported since, or one of the
# library's own objects (celery's package loads `celery.Celery` and the like when first asked), is not one
owners = {key.rsplit(".", 1)[0] for key in before}
added = sorted(key for key, value in after.items() if key not in before and key.rsplit(".", 1)[0] in owners
               and not isinstance(value, type(sys))
               and str(getattr(value, "__module__", "")).split(".")[0] not in LIBRARIES)
print(json.dumps({"changed": changed, "added": added, "transport": f"{transport_cls.__module__}.{transport_cls.__name__}",
                  "recorded": len(before)}))
'''


def test_importing_the_fleet_changes_no_attribute_of_kombu_celery_or_redis_py():
    # Given a fresh interpreter with kombu, Celery, redis-py and Flower loaded, every attribute recorded
    # When the workers package, the worker's app (Flower's), the producer and its app are imported and built
    done = subprocess.run([sys.executable, "-c", SNAPSHOT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])

    # Then no attribute of theirs changed or was added, and the worker's broker is its own transport, selected by name
    assert found["recorded"] > 5000
    assert found["changed"] == [] and found["added"] == []
    assert found["transport"] == "workers.intake.transport.Transport"
