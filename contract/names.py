"""Names that cross the wire: reason codes, prompt states, server states.

Each is a `str` enum, so it is its own value in JSON, in Redis and in f-strings,
and a typo is an AttributeError rather than a new code. Reason codes are the
dead-letter contract (`dead list --json`); verification rules are the subset a
run may switch off (`enqueue --disable-rule`).
"""
from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    def __str__(self) -> str:
        return self.value


class Reason(_Name):
    # Verification of a finished generation (workers/verify.py), by token id.
    ABORTED = "aborted"
    TRUNCATED = "truncated"
    TOKEN_COUNT_MISMATCH = "token_count_mismatch"
    UNEXPECTED_FINISH = "unexpected_finish"
    THINK_START_IN_OUTPUT = "think_start_in_output"
    MISSING_THINK_START = "missing_think_start"
    MISSING_THINK_END = "missing_think_end"
    MULTIPLE_THINK_END = "multiple_think_end"
    EMPTY_REASONING = "empty_reasoning"
    EMPTY_ANSWER = "empty_answer"
    # The fleet's own: the server, the prompt, or the worker.
    BAD_OUTPUT = "bad_output"
    SERVER_ERROR = "server_error"
    SERVER_REJECTED = "server_rejected"
    PROMPT_TOO_LONG = "prompt_too_long"
    WORKER_ERROR = "worker_error"
    POISON = "poison"   # delivered FLEET_MAX_DELIVERIES times, and each worker died holding it


THINK_RULES = (Reason.THINK_START_IN_OUTPUT, Reason.MISSING_THINK_START, Reason.MISSING_THINK_END,
               Reason.MULTIPLE_THINK_END, Reason.EMPTY_REASONING, Reason.EMPTY_ANSWER)
# The rules `enqueue --disable-rule` may switch off: verification, never the fleet's own reasons.
VERIFY_RULES = (Reason.ABORTED, Reason.TRUNCATED, Reason.TOKEN_COUNT_MISMATCH,
                Reason.UNEXPECTED_FINISH) + THINK_RULES


class PromptState(_Name):
    QUEUED = "queued"   # in the ledger with its ids: in the queue, in flight, or lost in transit
    DONE = "done"       # its sample is in a shard
    DEAD = "dead"       # its dead letter is in the store


class ServerState(_Name):
    UNKNOWN = "unknown"
    LOADING = "loading"    # connection refused: loading weights, or dead
    WARMING = "warming"    # /health answers 503
    HEALTHY = "healthy"    # /health answers 200
    DOWN = "down"          # /health times out or answers something else
    REFUSED = "refused"    # healthy but wrongly configured (preflight says why)


class Thinking(_Name):
    PROMPT = "prompt"   # the chat template appends think-start to the prompt
    OUTPUT = "output"   # the model emits think-start itself
    OFF = "off"         # not a reasoning model: no think rules
