"""The run's contract: what the producer and the workers both read and write.

`producer -> contract <- workers`. Nothing here builds a Celery app, reads the
environment or starts a thread when imported, and nothing imports pyarrow,
httpx or the worker: a module that needs a heavy library imports it inside the
function that uses it. Parts, by what each owns, top to bottom: a module
imports its own part and the parts below it, and no two files import each
other (`tests/specs/test_layout.py`).
- `broker/`: `config` (the Celery/kombu settings both sides must agree on); `publish` (prompts onto
  the broker as Celery protocol-2 messages); `kombu_redis` / `kombu_take` (what the fleet reads of
  kombu's Redis transport; its take and acknowledgement batched, a take replayed by its token: the
  worker's transport, `workers/intake/transport.py`, subclasses kombu's to use them); `worker_lease`
  (one lease per worker process); `versions` (the library versions a worker is built for,
  `constraints.txt`, and its refusal of others).
- `ledger/`: `ledger` / `ledger_scripts` (where each prompt stands and every change of it, one Lua
  script each); `deliveries` (a prompt's deliveries entry, its one format); `deadletters` (the
  dead-letter store); `codec` (how token ids are packed in Redis and in dead letters);
  `conversation_ledger` (where each conversation stands).
- `fleet/`: `heartbeats` (what a worker tells Redis about its servers and the prompts it holds);
  `cache_hits` (prefix-cache hits per server, summed across workers); `provenance` (each server's
  SGLang version, model and weight version).
- `run/`: `spec` (a run's spec: tokenizer, sampling, think tokens; run names); `samples` (several
  samples of a prompt, their keys and seeds); `line_sampling` / `line_fields` (a line's own sampling,
  and the fields a worker reads of it); `logprobs` (`--logprobs K`); `verifiers` (which answers pass).
- `chat/`: `template` (the chat template, token ids and the think-start check); `bundled` (the
  bundled tokenizer, `bundled_tokenizer/`); `tokenizer_probe` (a server's tokenizer is the run's);
  `conversations` (which history each turn renders).
- `settings`: the settings both sides read (where Redis is, where shards go, the queue prefix).
- `storage/`: where shards live and every read and write of one (`local`, `s3`, `refused`); `schema`
  (the shard columns and the `Sample` record a worker fills); `shard_home` (where a run's shards are);
  `durable` (the one fsync).
- `redis_link/`: `connections` / `retries` (Redis clients, and URLs safe to print; how long a call
  waits out an outage); `clock` (Redis's clock, the one every process compares times on);
  `replication` (writes confirmed on a replica before they are reported); `write_refusal` (Redis
  refusing writes, which refusal, and what the operator does); `scripts` (Lua scripts whose
  arguments have names).
- `names`: reason codes, prompt states and server states, as `str` enums.
- `keys`: every Redis key name and the task name.
- `counts`: a count with its noun in good English, as the commands and the worker's log print it.
"""
