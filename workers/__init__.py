"""The worker side of the fleet: `celery -A workers worker`.

Importing this package builds nothing: Celery finds the app in `workers.celery`,
which reads the settings once and builds it. The rest is laid out by the path a
prompt takes through a worker, one sub-package per part; a module imports its own
part and the parts below it, never one above (tests/specs/test_layout.py):
- `celery`: the Celery app and its broker settings (the entry point).
- `intake`: a prompt arrives and is held safely until it is stored or handed back
  (the task and its attempt loop, leases, the gate, shutdown, audit, poison prompts).
- `servers`: a server is chosen and called (bindings, health, capacity, routing,
  the `/generate` call and its deadline).
- `output`: the answer is checked (think tokens by id) and stored (Parquet shards).
- `reporting`: metrics, task events, Flower's guard, the worker's own threads.
- `settings`: the worker's settings, read once at the entry point and passed in.
What the producer shares with the workers (keys, ledger, dead letters, the
token-id codec, publishing, the shard schema) is the `contract` package.
"""
