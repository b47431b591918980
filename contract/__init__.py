"""The run's contract: what the producer and the workers both read and write.

`producer -> contract <- workers`. Nothing here builds a Celery app, reads the
environment or starts a thread when imported, and nothing imports pyarrow,
httpx or the worker: a module that needs a heavy library imports it inside the
function that uses it. Parts, one idea each:
- `keys`: every Redis key name and the task name.
- `names`: reason codes, prompt states and server states, as `str` enums.
- `settings`: the settings both sides read (where Redis is, where shards go, the queue prefix).
- `spec`: a run's spec (tokenizer, sampling, think tokens) and run names.
- `ledger` / `ledger_scripts` / `scripts`: where each prompt stands and every change of it, one
  Lua script each; Lua scripts whose arguments have names.
- `deliveries`: a prompt's deliveries entry (the workers it was delivered to), its one format.
- `deadletters`: the dead-letter store.
- `codec`: how token ids are packed in Redis and in dead letters.
- `publish`: prompts onto the broker as Celery protocol-2 messages.
- `broker`: the Celery/kombu settings both sides must agree on.
- `kombu_redis` / `kombu_take`: what the fleet reads of kombu's Redis transport; its take and
  acknowledgement batched, a take replayed by its token (the worker's transport,
  `workers/intake/transport.py`, subclasses kombu's to use them).
- `versions`: the library versions a worker is built for (`constraints.txt`), and its refusal of others.
- `connections` / `retries`: Redis clients, and URLs safe to print; how long a call waits out an outage.
- `clock`: Redis's clock, the one every process compares times on.
- `replication`: writes confirmed on a replica before they are reported (failover).
- `write_refusal`: Redis refusing writes, which refusal, and what the operator does.
- `heartbeats`: what a worker tells Redis about its servers and the prompts it holds.
- `cache_hits`: prefix-cache hits per server, summed across workers.
- `schema`: the shard columns and the `Sample` record a worker fills.
- `storage` / `shard_home` / `durable`: where shards live and every read and write of one; where a
  run's shards are; the one fsync.
- `chat` / `bundled`: the chat template, token ids and the think-start check; the bundled tokenizer.
- `conversations` / `conversation_ledger`: which history each turn renders; where each conversation stands.
"""
