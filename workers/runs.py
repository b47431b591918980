"""A run: prompts tokenized one way, generated one way, stored together.

The producer writes the run's spec once; workers read it to know the sampling
parameters and which token ids mark the reasoning. Every Redis key the fleet
uses for a run is named here, so that the producer and workers agree.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import redis

THINK_IN_PROMPT = "prompt"   # the chat template appends think-start to the prompt
THINK_IN_OUTPUT = "output"   # the model emits think-start itself
THINK_OFF = "off"            # not a reasoning model: no think rules


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
    created_at: float = field(default_factory=time.time)

    def identity(self) -> dict:
        """What must match for two enqueues to belong to the same run."""
        keep = ("tokenizer_fingerprint", "template_fingerprint", "sampling", "thinking",
                "think_start_id", "think_end_id", "served_model", "disabled_rules")
        return {k: getattr(self, k) for k in keep}

    def fingerprint(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "RunSpec":
        return cls(**json.loads(text))


class RunKeys:
    """Redis key names of one run."""

    def __init__(self, run: str):
        base = f"fleet:run:{run}"
        self.spec = base
        self.state = f"{base}:state"        # hash: prompt id -> queued | done | dead
        self.dead = f"{base}:dead"          # hash: prompt id -> dead letter JSON
        self.counters = f"{base}:counters"  # hash: enqueued, done, dead, tokens_in, tokens_out, ...
        self.crashes = f"{base}:crashes"    # hash: prompt id -> unexpected task failures
        self.minutes = f"{base}:minutes"    # hash: "<minute>:samples|tokens" -> count, for rates
        # hash: prompt id -> packed token ids (payload.py), while not done or dead. Named
        # `ids`, not `prompts` as when it held int32: no version reads the other's bytes.
        self.prompts = f"{base}:ids"


RUNS_KEY = "fleet:runs"
QUEUED, DONE, DEAD = "queued", "done", "dead"


def queue_for(prefix: str, served_model: str | None) -> str:
    """Runs that name a model get their own queue, consumed only beside that model."""
    return f"{prefix}@{served_model}" if served_model else prefix


def run_queues(client: redis.Redis, prefix: str) -> dict[str, str]:
    """Each run's name, and the queue its prompts are published to."""
    queues = {}
    for raw in sorted(client.smembers(RUNS_KEY)):
        spec = load_spec(client, raw.decode())
        queues[raw.decode()] = queue_for(prefix, spec.served_model if spec else None)
    return queues


def save_spec(client: redis.Redis, spec: RunSpec) -> None:
    client.set(RunKeys(spec.name).spec, spec.to_json())
    client.sadd(RUNS_KEY, spec.name)


def load_spec(client: redis.Redis, run: str) -> RunSpec | None:
    raw = client.get(RunKeys(run).spec)
    return RunSpec.from_json(raw) if raw else None


@lru_cache(maxsize=64)
def _cached_spec(url: str, run: str) -> RunSpec | None:
    from .redis_client import redis_for

    return load_spec(redis_for(url), run)


def cached_spec(url: str, run: str) -> RunSpec:
    """A run's spec never changes once written, so workers read it once."""
    spec = _cached_spec(url, run)
    if spec is None:
        _cached_spec.cache_clear()
        raise LookupError(f"run {run!r} has no spec in Redis; was it enqueued with this REDIS_URL?")
    return spec
