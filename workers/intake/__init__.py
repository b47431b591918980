"""A prompt arrives and is held safely until it is stored or handed back.

Owns the Celery task and its attempt loop, what one worker process shares between its task
threads (`runtime`), and all that keeps a delivery safe while it runs: leases renewed, a cut
broker connection that takes nothing away, poison prompts counted, lost messages audited, a
sample stored just before its worker died found, the consumer gate, SIGTERM's hand-back.

- `accounted`: Where a pending prompt's message may be when it is not in its queue: the audit's reads per prompt.
- `attempts`: What happened to one prompt so far, and the ways its request loop ends without an answer.
- `audit`: The audit: a queued prompt whose message the broker lost is published again.
- `burial`: Every dead letter goes through `bury`: one choke point, so each is stored once, counted and logged.
- `consumer`: A cut broker connection is not a crash: prompts in flight stay with the worker that runs them.
- `deliveries`: Poison prompts end: a prompt whose deliveries keep dying with their worker becomes a dead letter.
- `failover`: After a failover, a worker moves to the new primary at once and asserts there what it holds and stored.
- `gate`: Consume only with somewhere to send, and somewhere to store.
- `generation`: One prompt, from token ids to a durable sample or a dead letter.
- `group_acks`: A group commit acknowledges its samples' deliveries, in the round trip that marks them done.
- `group_intake`: Intakes of tasks that start together go to Redis together: one round trip, not one each.
- `heap`: Python's cyclic garbage collector, set for a worker that stores hundreds of samples a second.
- `lease`: Leases: a live worker keeps its prompts; a dead worker's come back quickly; none is held forever.
- `recent`: What a worker wrote lately, kept a while: what a failover may have lost, to write again.
- `reconcile`: A sample stored just before its worker died is found, not generated again.
- `redis_pool`: The worker's Redis connections: a few, whatever its threads and servers.
- `redis_writes`: Whether Redis takes this worker's writes now, as its own writes find out.
- `request_loop`: Requests until a server answers: the attempt loop of one prompt, and what each failure spends.
- `runtime`: The parts one worker process shares between its task threads.
- `shutdown`: SIGTERM drains within a grace period, keeps what is finished, then hands back the rest.
- `specs`: A run's spec, read once per worker process.
- `tasks`: The one task: generate a prompt's trace and store it (or dead-letter it).

May import `workers.servers`, `workers.output`, `workers.reporting`, `workers.settings` and
`contract`; never `workers.celery` (the entry point, which builds the app from this part).
"""
