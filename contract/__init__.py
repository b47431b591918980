"""The run's contract: what the producer and the workers both read and write.

`producer -> contract <- workers`. Nothing here builds a Celery app, reads the
environment or starts a thread when imported, and nothing imports pyarrow,
httpx or the worker: a module that needs a heavy library imports it inside the
function that uses it. Parts, one idea each:
- `keys`: every Redis key name and the task name.
- `names`: reason codes, prompt states and server states, as `str` enums.
- `spec`: a run's spec (tokenizer, sampling, think tokens) and run names.
- `ledger`: where each prompt stands; every state change of a prompt.
- `deadletters`: the dead-letter store.
- `codec`: how token ids are packed in Redis and in dead letters.
- `publish`: prompts onto the broker as Celery protocol-2 messages.
- `broker`: the Celery/kombu settings both sides must agree on.
- `kombu_redis`: the one door to kombu's Redis transport internals.
- `patches`: how a replacement of a library's function is installed once and reads the library's own.
- `schema`: the shard columns and the `Sample` record a worker fills.
- `connections`: Redis clients, and URLs safe to print.
- `heartbeats`: what a worker tells Redis about its servers.
- `chat` / `bundled`: the chat template, token ids and the think-start check; the bundled tokenizer.
- `conversations` / `conversation_ledger`: which history each turn renders; where each conversation stands.
"""
