"""Python's cyclic garbage collector, set for a worker that stores hundreds of samples a second.

Each sample allocates a few thousand container objects (the message, the
request and the answer's JSON, the row, Celery's request and events), and
Python's collector runs a young-generation pass every 700 net allocations and
now and then a full pass over every object the process holds (its modules,
Celery, pyarrow, the tokenizer: ~110,000 objects once started). On a busy
worker that was about a tenth of its CPU (perf: `gc_collect_main` and its
`visit_*` helpers, 10% of the samples at ~260 samples a second).

At start (`worker_ready`), what the worker has loaded is collected once and
frozen (`gc.freeze`: moved to a generation the collector never scans; it is
never garbage, it lives as long as the process), and the young generation's
threshold is raised, so a pass comes every few samples instead of several
times a sample. Nothing is leaked: every object created afterwards is still
collected, only in larger batches; the memory a batch can hold before its pass
is a few MB.
"""
from __future__ import annotations

import gc

# Net container allocations between young-generation passes (Python's default: 700), and how
# many passes of each generation before one of the next (defaults 10 and 10).
THRESHOLDS = (50_000, 20, 100)


def settle() -> None:
    """Collect once, freeze what the started worker holds, and space the collector's passes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
