"""A generation's answer is checked and stored.

Owns the think structure verified by token id, an answer checked by the run's verifier, a
conversation's next turn rendered once its turn is stored, Parquet shards written by group commit, and a start refused where
`OUTPUT_DIR` takes no writes.

- `shards`: Parquet shards written by group commit.
- `storage_guard`: A worker refuses to start when `OUTPUT_DIR` cannot take shards at all.
- `turns`: After a conversation's turn is stored: render the next turn and queue it.
- `verdicts`: A stored sample's verdict: its answer checked by the run's verifier, in a process of its own.
- `verdict_child`: The process a worker's verifier checks run in.
- `verify`: Think-structure verification by token id, one stable reason code per rule.

May import `workers.reporting`, `workers.settings` and `contract`; never the parts above it
(`workers.intake`, `workers.servers`) or `workers.celery`.
"""
