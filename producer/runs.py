"""The runs in Redis, for `python -m producer runs`: each one's counts and where its shards are.

Read from the run registry (`keys.RUNS`) and each run's counters, recorded
shard homes (`contract/shard_home.py`) and provenance (`contract/provenance.py`:
the models, SGLang and weight versions that made its samples): a few commands
per run, never a scan of the keyspace.
"""
from __future__ import annotations

import redis

from contract.keys import RUNS
from contract.ledger import Ledger
from contract.provenance import read_provenance
from contract.shard_home import recorded
from contract.spec import OlderLayout, load_spec


def list_runs(client: redis.Redis) -> list[dict]:
    """One entry per run, by name: prompts, queued, done, dead, shards (recorded homes); a run
    this version does not read (an older layout) says so in `refused`."""
    found = []
    for name in sorted(raw.decode() for raw in client.smembers(RUNS)):
        entry = {"run": name, "prompts": 0, "queued": 0, "done": 0, "dead": 0, "shards": recorded(client, name)}
        try:
            if load_spec(client, name) is None:
                continue
        except OlderLayout as exc:
            found.append(entry | {"refused": f"older layout: {exc}"})
            continue
        tally = Ledger(client, name).tally()
        origins = read_provenance(client, name)  # one read: its size is the run's servers, not its prompts
        found.append(entry | {"prompts": tally.queued + tally.done + tally.dead, "queued": tally.queued,
                              "done": tally.done, "dead": tally.dead,
                              "models": sorted({o.model_path for o in origins if o.model_path}),
                              "sglang_versions": sorted({o.sglang_version for o in origins if o.sglang_version}),
                              "weight_versions": sorted({o.weight_version for o in origins})})
    return found
