"""A server is chosen and called: the SGLang servers (or gateways) a worker is bound to.

Owns the bindings and their state (health, preflight, load, capacity and each worker's share
of it), where a prompt goes (prefix-cache affinity, the CPU-bound signal), and the one
`/generate` call: its client, credentials, deadline and what a 200 answer must be.

- `affinity`: Affinity: send a prompt where its prefix is already in a server's prefix cache, within a load guard.
- `answers`: What a 200 answer from `/generate` must be before it counts as a generation.
- `auth`: Credentials written into `SGLANG_URLS` (`http://user:token@host:port`), sent but never shown.
- `bindings`: Server bindings: the SGLang servers a worker sends to, and their true state.
- `cache_hits`: A worker's prefix-cache figures: read from each answer, counted, and kept for the last minutes.
- `capacity`: How many requests to keep in flight on one server: its running batch full, a short queue behind it.
- `cpu_bound`: When the worker process itself is the bottleneck: its CPU near what it can use, its servers with free slots.
- `cpu_limits`: How many cores this process can use: one (the GIL), fewer where its cgroup's CPU quota allows less.
- `deadlines`: A whole request's deadline, however its server sends (or withholds) the bytes.
- `gateway_answers`: Which failed answers are SGLang's gateway speaking for itself, not a server judging the prompt.
- `gateway_preflight`: The preflight of a binding that is SGLang's model gateway: judged from the servers it lists.
- `health`: The background thread that keeps each server binding's state true.
- `http1`: One HTTP/1.1 POST on a pooled keep-alive socket: the bytes out, the status and body back.
- `load`: What a server says about its capacity and its load, over HTTP; and what SGLang's gateway adds.
- `preflight`: What a server must show before it gets its first prompt.
- `server_info`: A server's info routes: read (`fetch_info`), and one server judged from its answers (`apply_info`, pure).
- `sglang_client`: One call to SGLang's native `POST /generate`, and what its failures mean.
- `sharers`: How many live workers are bound to each of this worker's servers, counted in Redis.

May import `workers.output`, `workers.reporting`, `workers.settings` and `contract`; never
`workers.intake` or `workers.celery`.
"""
