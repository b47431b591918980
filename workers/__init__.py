"""The worker side of the fleet: `celery -A workers worker`.

Parts, one idea each:
- `app`: the Celery app and its broker settings.
- `tasks` / `generation`: one prompt from token ids to a sample or a dead letter.
- `servers`, `health`, `preflight`: the SGLang servers a worker is bound to.
- `gate`: consume only while a bound server is healthy.
- `lease`: keep in-flight prompts leased to this worker.
- `sglang_client`: the `/generate` call and its failure classes.
- `verify`: the think structure, by token id.
- `shards`: Parquet shards by group commit.
- `deadletter`, `ledger`, `runs`: what Redis holds about a run.
"""
from . import flower_guard  # noqa: F401  (Flower refuses to listen beyond localhost without auth)
from .app import app

__all__ = ["app"]
