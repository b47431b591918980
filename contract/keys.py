"""Every Redis key name the fleet uses, in one place.

The producer and the workers agree on these names. A run records the layout
of its keys (`LAYOUT`, in its spec): a version reads only runs of its own
layout and refuses the others (`contract.run.spec.load_spec`). kombu's own keys (`unacked`, `unacked_index`, the queues'
priority lists) are named by kombu and read only through `kombu_redis`.
"""
from __future__ import annotations

RUNS = "fleet:runs"                  # set: every run's name
WORKER_PREFIX = "fleet:worker:"      # string per worker: its heartbeat (JSON, expires)
AUDIT_LOCK = "fleet:audit:lock"      # string: the worker running the lost-message audit
# hash per run: where the audit's pass over the run's pending prompts stands (`cursor`), and the
# prompts its last round found missing (`suspects`, JSON) at `at` (Redis's clock); workers/intake/audit.py
AUDIT_PREFIX = "fleet:audit:run:"
REPLICATED = "fleet:replicated"      # counter: a write whose replication confirms every earlier one (replication.py)
WORKERS = "fleet:workers"            # sorted set: worker -> time of its last heartbeat
LEASES = "fleet:leases"              # sorted set: lease holder (a worker process's number) -> its last lease round (worker_lease.py)
TAKE_PREFIX = "fleet:take:"         # hash per lease holder: taking thread -> its last take's token and what it recorded (kombu_take.py)
SHARERS_PREFIX = "fleet:sharers:"    # sorted set per server URL (redacted): worker -> its last health round there
SOLO_PREFIX = "fleet:solo:"          # string per server URL (redacted): the worker sending a crash suspect alone there
TASK_NAME = "fleet.generate"         # the one Celery task
DEFAULT_QUEUE = "fleet.generate"     # queue prefix (FLEET_QUEUE_PREFIX)
# A run's prompt states are spread over this many hashes (`RunKeys.state_bucket`): few
# enough that their fixed cost per key is ~3 bytes a prompt at 10^6 prompts, many enough
# that a bucket stays within Redis's compact listpack encoding (`hash-max-listpack-entries`:
# 128 by default, ~4 million prompts a run; 512, ~16 million). Fixed, because a run grows
# by re-enqueueing appended lines, so its size is never known up front; another count
# would be another key name.
STATE_BUCKETS = 1 << 15
# The layout of a run's keys and values that this version writes and reads, recorded in
# each run's spec (`RunSpec.layout`; a spec without it is layout 0). Raised whenever a key
# changes meaning, so that no version reads bytes another one wrote.
LAYOUT = 1


class RunKeys:
    """Redis key names of one run."""

    def __init__(self, run: str):
        base = f"fleet:run:{run}"
        self.spec = base                    # string: the run's spec (JSON)
        # The ledger (contract/ledger/ledger.py) owns the state buckets, dead, dead_reasons, counters, minutes,
        # shards, writing, budgets and prompts: only its scripts change them, each a prompt's whole transition in one
        # atomic step.

        # hash per bucket, STATE_BUCKETS of them: each prompt's state, under 8 bytes of a hash of
        # its id (`contract/ledger/ledger.py` says how, and why it is compact)
        self.state_prefix = f"{base}:s:"
        self.dead = f"{base}:dead"          # hash: prompt id -> dead letter JSON, while dead
        # hash: prompt id -> its dead letter's reason, beside it: what the counts by reason need,
        # read by the ledger's scripts without decoding a letter
        self.dead_reasons = f"{base}:dead:reasons"
        # hash: enqueued, prompt_tokens, output_tokens, state:queued|done|dead, reason:CODE
        # (dead letters by reason), verdict:pass|fail|error (stored samples by verdict class, in a run
        # with a verifier: contract/run/verifiers.py), prompts (distinct prompts, in a run of several
        # samples a prompt: contract/run/samples.py), and the conversations' counts (conversation_ledger.py)
        self.counters = f"{base}:counters"
        self.crashes = f"{base}:crashes"    # hash: prompt id -> unexpected task failures
        # hash: prompt id -> JSON list of the server crashes it was in flight at ({server, at}; server_crashes.py)
        self.server_crashes = f"{base}:server-crashes"
        # hash: prompt id -> the workers it was delivered to, one name a line, while unfinished
        self.deliveries = f"{base}:deliveries"
        self.minutes = f"{base}:minutes"    # hash: "<minute>:samples|tokens" -> count, for rates
        self.shards = f"{base}:shards"      # hash: shard code -> prompts whose canonical copy it holds
        # hash: prompt id -> the file name of the shard its sample is being written to, from
        # just before its group's write until it is done or dead (contract/ledger/ledger.py: writing entries)
        self.writing = f"{base}:writing"
        # set: where the run's shards are (each writing worker's OUTPUT_DIR, absolute: shard_home.py)
        self.shard_homes = f"{base}:homes"
        # hash: prompt id -> packed token ids (contract/ledger/codec.py), while not done or dead
        self.token_ids = f"{base}:ids"
        # hash: prompt (sample) key -> the max_new_tokens its message was last requeued with (`dead
        # requeue`), while queued: what any delivery of it is generated with (the intake reads it),
        # whichever message brought it (a lost one the audit published again, an older duplicate)
        self.budgets = f"{base}:budgets"
        # hash: prompt id (a line's id, not a sample's key) -> what a worker needs of its line beyond
        # its ids (JSON: its own `sampling`, and its fields for a verifier), kept for the run's life
        # (line_fields.py)
        self.line_fields = f"{base}:lines"
        # hash: "<server URL, redacted>|<weight version>" -> JSON of the server's SGLang version, model
        # and when a worker first got a sample of the run there with those weights (provenance.py)
        self.provenance = f"{base}:provenance"
        # A run of conversations (`enqueue --turns all`; `conversation_ledger.py` owns these):

        # hash: conversation id -> its number of turns, kept for the run's life
        self.conversation_turns = f"{base}:conv:turns"
        # hash: conversation id -> its skeleton (JSON, `conversations.skeleton`), while in progress
        self.conversation_shapes = f"{base}:conv:shape"
        # hash: conversation id -> the turn it is at (queued, in flight, dead or just stored), while in progress
        self.conversation_at = f"{base}:conv:at"
        # hash: turn id -> the stored turn's answer as later turns' history holds it (JSON), while in progress
        self.conversation_answers = f"{base}:conv:answers"
        # hash: conversation id -> the server (a worker's binding URL, redacted) that generated its
        # last stored turn, where its next turn's prefix is cached (workers/servers/affinity.py), while in progress
        self.conversation_server = f"{base}:conv:server"

    def state_bucket(self, n: int) -> str:
        """The hash that holds the states of the prompts whose id hashes to bucket `n`."""
        return f"{self.state_prefix}{n}"


def queue_for(prefix: str, served_model: str | None) -> str:
    """Runs that name a model get their own queue, consumed only beside that model."""
    return f"{prefix}@{served_model}" if served_model else prefix


def task_id(run: str, prompt_id: str) -> str:
    """A prompt's Celery task id: the same every time it is published."""
    return f"{run}:{prompt_id}"
