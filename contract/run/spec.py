"""A run: prompts tokenized one way, generated one way, stored together.

The producer writes the run's spec once; workers read it to know the sampling
parameters and which token ids mark the reasoning. A run's name becomes a
Redis key part and a folder under `OUTPUT_DIR`, so it is checked against a safe
pattern wherever a run is named: no path separator, no `..`, nothing absolute,
no `:` (which would let one run's keys collide with another's).

A run is read only by a version of its own key layout (`keys.LAYOUT`, which
the spec records): `load_spec` refuses any other, and every command and the
worker read a run's spec before its ledger, so no version reads, or
converts, keys another layout wrote.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field, fields

import redis

from contract.keys import LAYOUT, RUNS, RunKeys, queue_for

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class BadRunName(ValueError):
    """A run name that could escape `OUTPUT_DIR` or collide with another run's keys."""


class OlderLayout(LookupError):
    """A run an older layout of the fleet's keys wrote: this version does not read it."""

    def __init__(self, run: str, why: str):
        super().__init__(f"run {run!r} was written by an older version of the fleet ({why}), whose ledger this "
                         f"version does not read: enqueue its prompts under a new run name (--run NEW_NAME)")
        self.run = run


def check_run_name(name: str) -> str:
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name) or ".." in name:
        raise BadRunName(f"run name {name!r} is not allowed: use 1-128 letters, digits, '_', '.' or '-', "
                         f"starting with a letter or digit, without '..'")
    return name


@dataclass(frozen=True)
class RunSpec:
    name: str
    tokenizer: str
    tokenizer_fingerprint: str
    template_fingerprint: str
    sampling: dict
    thinking: str
    think_start_id: int | None
    think_end_id: int | None
    stop_ids: list[int]
    served_model: str | None = None
    disabled_rules: list[str] = field(default_factory=list)
    # len(tokenizer): an output id at or above it is not a token of this model
    # (None: a spec written before the field; only the int32 bound applies).
    vocab_size: int | None = None
    # `enqueue --turns`: "last" (one generation per prompt) or "all" (every assistant turn of
    # a conversation, each rendered by a worker from the answers before it: contract/chat/conversations.py)
    turns: str = "last"
    trust_remote_code: bool = False  # how a worker loads `tokenizer` to render a conversation's turns
    # whether the template renders earlier turns' reasoning; if not, a conversation keeps only
    # its answers' content for later turns (ChatTokenizer.renders_history_reasoning)
    history_reasoning: bool = True
    # the tokenizer probe (contract/chat/tokenizer_probe.py): texts and the run's ids for them, which a
    # server's own tokenizer must give before any prompt of the run goes there (None: an older spec)
    probe: dict | None = None
    # `enqueue --samples N`: samples of each prompt, each keyed and seeded by contract/run/samples.py
    samples: int = 1
    # `enqueue --until-verified K`: sample a prompt until K of its samples pass the verifier, at most
    # `samples` in all (None: every prompt gets `samples` samples)
    until_verified: int | None = None
    verify: str | None = None        # `enqueue --verify NAME`: the verifier each sample's answer is checked by
    logprobs: int | None = None      # `enqueue --logprobs K`: the top-K log-probabilities of each output token
    # whether some lines carry their own sampling or fields a worker reads (contract/run/line_fields.py)
    line_fields: bool = False
    created_at: float = field(default_factory=time.time)
    layout: int = LAYOUT  # the layout of the run's keys (`keys.LAYOUT`); 0 in a spec written before the field

    def identity(self) -> dict:
        """What must match for two enqueues to belong to the same run."""
        keep = ("tokenizer_fingerprint", "template_fingerprint", "sampling", "thinking",
                "think_start_id", "think_end_id", "served_model", "disabled_rules", "turns")
        # fields added later count only where set, so an older run's identity (and fingerprint) stays
        newer = {"samples": 1, "until_verified": None, "verify": None, "logprobs": None}
        return {**{k: getattr(self, k) for k in keep},
                **{k: getattr(self, k) for k, unset in newer.items() if getattr(self, k) != unset}}

    def fingerprint(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "RunSpec":
        """Fields a newer producer added are ignored, so an older worker still reads the spec."""
        known = {f.name for f in fields(cls)}
        return cls(**{"layout": 0, **{k: v for k, v in json.loads(text).items() if k in known}})


def run_queues(client: redis.Redis, prefix: str) -> dict[str, str]:
    """Each run's name, and the queue its prompts are published to; a run of an older
    layout (`OlderLayout`) is none of this version's business."""
    queues = {}
    for raw in sorted(client.smembers(RUNS)):
        try:
            spec = load_spec(client, raw.decode())
        except OlderLayout:
            continue
        queues[raw.decode()] = queue_for(prefix, spec.served_model if spec else None)
    return queues


def save_spec(client: redis.Redis, spec: RunSpec) -> None:
    check_run_name(spec.name)
    client.set(RunKeys(spec.name).spec, spec.to_json())
    client.sadd(RUNS, spec.name)


def load_spec(client: redis.Redis, run: str) -> RunSpec | None:
    """The run's spec; its name is the checked one it is stored under, so a spec edited
    in Redis cannot carry a name that builds a path outside `OUTPUT_DIR`. Raises
    `OlderLayout` for a run another layout wrote: its spec records none, or its keys have
    an older layout's shape (one `state` hash keyed by id; prompts counted, but not by state)."""
    keys = RunKeys(check_run_name(run))
    with client.pipeline(transaction=False) as pipe:
        pipe.get(keys.spec)
        pipe.exists(f"{keys.spec}:state")
        pipe.hmget(keys.counters, ["enqueued", "state:queued", "state:done", "state:dead"])
        raw, state_hash, (enqueued, *by_state) = pipe.execute()
    if not raw:
        return None
    spec = RunSpec.from_json(raw)
    if spec.name != run:
        raise BadRunName(f"the spec stored for run {run!r} names another run ({spec.name!r})")
    if spec.layout != LAYOUT:
        raise OlderLayout(run, f"its spec records key layout {spec.layout}, this version's is {LAYOUT}")
    if state_hash:
        raise OlderLayout(run, "its prompts' states are one hash keyed by id")
    if enqueued is not None and by_state == [None, None, None]:
        raise OlderLayout(run, "its prompts are counted, but not by state")
    return spec
