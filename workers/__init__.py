"""The worker side of the fleet: `celery -A workers worker`.

Importing this package builds nothing: Celery finds the app in `workers.celery`,
which reads the settings once and builds it. Parts, one idea each:
- `celery`: the Celery app and its broker settings (the entry point).
- `tasks` / `generation`: one prompt from token ids to a sample or a dead letter.
- `servers`, `health`, `preflight`, `server_load`: the SGLang servers (or gateways) a worker is bound to.
- `capacity`: how many requests each server gets, tuned from what it reports.
- `gate`: consume only while a bound server is healthy.
- `lease`: keep in-flight prompts leased to this worker.
- `shutdown`, `consumer`, `audit`: SIGTERM, broker reconnects, lost messages.
- `sglang_client` / `deadlines`: the `/generate` call, its failure classes and its deadline; `answers`: what a 200 must be.
- `verify`: the think structure, by token id.
- `shards` / `reconcile`: Parquet shards by group commit; a sample stored just before its worker died.
- `turns`: a conversation's next turn, rendered after its turn is stored.
- `runtime`, `settings`, `metrics`: what one worker process shares between threads.
What the producer shares with the workers (keys, ledger, dead letters, the
token-id codec, publishing, the shard schema) is the `contract` package.
"""
