"""What made a run's samples: each server's SGLang version, model and weight version.

A trainer that gets a dataset must be able to tell which checkpoint answered,
and above all whether the weights changed while the run went on (an RL loop
that pushes new weights with `/update_weights_from_disk` changes SGLang's
`weight_version`, and each `/generate` answer's `meta_info.weight_version`
says which weights made it). So a run keeps one Redis hash
(`RunKeys.provenance`) with an entry per distinct (server, weight version) its
samples came from: field `<server URL, redacted>|<weight version>`, value JSON
`{server, sglang_version, weight_version, model_path, served_model_name,
first_seen, worker}`. `first_seen` is the worker's clock (seconds since the
epoch) when it first got an answer there with that weight version; the entry
is written with HSETNX, so the first worker to see it keeps it, and a later
one changes nothing. The SGLang version and model come from the server's
`/server_info` and `/model_info`, read by the worker's preflight anyway.

**Costs are flat** (DESIGN invariant 9): a worker writes an entry only the first
time it sees that (run, server, weight version) itself (`Recorder` remembers
them in memory), so per sample it costs one dictionary look-up and no Redis
command; a run of 10^6 samples over 100 servers with one weight version each
writes at most (workers x servers) entries, most of them no-ops. A write that
fails (Redis away) is forgotten, not remembered, so the next answer tries again;
it never fails the sample.

The producer reads the hash whole (`read_provenance`): its size is the number of
distinct servers and weight versions, never the run's size. `export` writes it
into the dataset card and the manifest, `status --json` shows it.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass

import redis

from contract.keys import RunKeys

SEPARATOR = "|"
UNKNOWN = "unknown"  # a weight version no answer or info route said


@dataclass(frozen=True)
class Origin:
    """One (server, weight version) a run's samples came from."""
    server: str                      # the worker's binding URL, redacted
    weight_version: str
    sglang_version: str | None = None
    model_path: str | None = None
    served_model_name: str | None = None
    first_seen: float | None = None
    worker: str | None = None

    def field(self) -> str:
        return f"{self.server}{SEPARATOR}{self.weight_version}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def weight_version_of(meta_info: dict | None, fallback: str | None = None) -> str:
    """The weight version an answer says made it (`meta_info.weight_version`), else the server's
    (`/model_info`), else "unknown"."""
    value = (meta_info or {}).get("weight_version")
    if value is None or value == "":
        value = fallback
    return str(value) if value not in (None, "") else UNKNOWN


class Recorder:
    """One worker process's memory of the (run, server, weight version) it has recorded.

    `observe` only notes a new origin (no Redis command: it is called on a sample's path, where a
    Redis that takes no writes would hold the sample back from its group commit); `flush` writes
    what was noted, once a sample is settled. A failed flush keeps its origins for the next one."""

    def __init__(self, worker: str):
        self.worker = worker
        self._seen: set[tuple[str, str, str]] = set()
        self._pending: dict[tuple[str, str, str], Origin] = {}
        self._lock = threading.Lock()

    def observe(self, run: str, server: str, weight_version: str, sglang_version: str | None,
                model_path: str | None, served_model_name: str | None) -> bool:
        """Note the origin once; True when it is new to this process."""
        key = (run, server, weight_version)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            self._pending[key] = Origin(server, weight_version, sglang_version, model_path, served_model_name,
                                        time.time(), self.worker)
        return True

    def flush(self, client: redis.Redis) -> int:
        """Write the origins noted since the last flush (one HSETNX each, one round trip); how many.
        Raises a Redis error, keeping them for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        try:
            with client.pipeline(transaction=False) as pipe:
                for (run, _, _), origin in pending.items():
                    pipe.hsetnx(RunKeys(run).provenance, origin.field(), origin.to_json())
                pipe.execute()
        except redis.RedisError:
            with self._lock:
                self._pending = {**pending, **self._pending}
            raise
        return len(pending)


def read_provenance(client: redis.Redis, run: str) -> list[Origin]:
    """Every origin of the run's samples, by first seen; entries a newer version wrote with more
    fields keep the fields this version knows."""
    known = set(Origin.__dataclass_fields__)
    found = []
    for raw in client.hgetall(RunKeys(run).provenance).values():
        try:
            data = json.loads(raw)
            found.append(Origin(**{k: v for k, v in data.items() if k in known}))
        except (ValueError, TypeError):
            continue
    return sorted(found, key=lambda o: (o.first_seen or 0.0, o.server, o.weight_version))


def summary(origins: list[Origin]) -> dict:
    """The origins as plain data for the manifest, `status --json` and the card."""
    return {
        "servers": [asdict(o) for o in origins],
        "sglang_versions": sorted({o.sglang_version for o in origins if o.sglang_version}),
        "weight_versions": sorted({o.weight_version for o in origins}),
        "model_paths": sorted({o.model_path for o in origins if o.model_path}),
    }
