"""What the worker shows of itself.

Owns the Prometheus metrics, task events batched for Flower, Flower's refusal to listen
beyond localhost without authentication, and the worker's own threads: their troubles
logged once per change, and an exit when one it needs has died (`lifeline`).

- `events`: Task events in batches: Flower sees every task; the worker pays for a few publishes a second.
- `flower_guard`: Flower may listen beyond localhost only behind authentication.
- `lifeline`: A worker whose own threads fail says so: once per change, and by exiting when it can no longer work.
- `log_lines`: A prompt handed back is one line in the worker's log, never a traceback.
- `metrics`: Prometheus metrics of one worker process (`FLEET_METRICS_PORT`, 0 to disable).

May import `workers.settings` and `contract` only: every other part reports through it.
"""
