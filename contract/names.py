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
    # Verification of a finished generation (workers/output/verify.py), by token id.
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
    SERVER_CRASH = "server_crash"  # its server died with it in flight, then twice when it was sent there alone


THINK_RULES = (Reason.THINK_START_IN_OUTPUT, Reason.MISSING_THINK_START, Reason.MISSING_THINK_END,
               Reason.MULTIPLE_THINK_END, Reason.EMPTY_REASONING, Reason.EMPTY_ANSWER)
# The rules `enqueue --disable-rule` may switch off: verification, never the fleet's own reasons.
VERIFY_RULES = (Reason.ABORTED, Reason.TRUNCATED, Reason.TOKEN_COUNT_MISMATCH,
                Reason.UNEXPECTED_FINISH) + THINK_RULES

# What each code means to the person reading a dead letter: the documentation's reason-code
# reference is generated from this (scripts/mkdocs_hooks.py), so a new code needs its line here.
MEANINGS: dict[Reason, str] = {
    Reason.THINK_START_IN_OUTPUT: "a think-start token in the output (also SGLang echoing prompt tokens)",
    Reason.MISSING_THINK_START: "`--thinking output` and the output does not begin with think-start",
    Reason.MISSING_THINK_END: "no think-end token in the output",
    Reason.MULTIPLE_THINK_END: "more than one think-end token in the output",
    Reason.EMPTY_REASONING: "nothing before think-end",
    Reason.EMPTY_ANSWER: "nothing but a stop token after think-end",
    Reason.TRUNCATED: "`finish_reason.type == \"length\"`: replay with "
                      "`dead requeue --reason truncated --max-new-tokens N`",
    Reason.ABORTED: "`finish_reason.type == \"abort\"`",
    Reason.UNEXPECTED_FINISH: "a `finish_reason` that is neither stop, length nor abort",
    Reason.TOKEN_COUNT_MISMATCH: "`completion_tokens != len(output_ids)`, or `prompt_tokens` differs from what "
                                 "was sent",
    Reason.SERVER_REJECTED: "HTTP 400 from SGLang (its message is kept)",
    Reason.BAD_OUTPUT: "a 200 answer that is not a generation of this model (an `output_ids` entry that is not a "
                       "token id of its vocabulary, `meta_info` of the wrong types, a body that is not JSON or "
                       "absurdly large), on every server tried, with the server's excerpt kept; or a sample the "
                       "shard format cannot hold (an id outside int32, a length that does not add up)",
    Reason.SERVER_ERROR: "transient failures (5xx, 503, timeouts) outlasted the retry budget "
                         "(`FLEET_MAX_ATTEMPTS`)",
    Reason.PROMPT_TOO_LONG: "leaves no room for an answer in the server's context (prompt >= context length - 1, "
                            "SGLang refusing prompt + budget >= context) or exceeds its `max_req_input_len` "
                            "(or `enqueue --max-prompt-tokens`, reported at enqueue)",
    Reason.POISON: "the prompt's workers died holding it (OOM, a native crash) more than `FLEET_MAX_DELIVERIES` "
                   "times, the last time alone in its worker (the workers are in `excerpt.held_by`)",
    Reason.SERVER_CRASH: "the prompt was in flight when its server died (the connection closed with no answer, "
                         "then the server unreachable), and the server died twice more when the prompt was sent "
                         "there alone: never sent again (`excerpt.crashes` lists the servers and times); check the "
                         "servers' logs, and that the run's tokenizer is the served model's",
    Reason.WORKER_ERROR: "the task failed unexpectedly `FLEET_MAX_CRASHES` times (traceback kept); also a "
                         "prompt Redis forgot (evicted, flushed), a conversation's next turn that cannot "
                         "be rendered, and a prompt holding an id outside the run's tokenizer (never sent: it "
                         "could kill the server)",
}


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
