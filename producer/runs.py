"""The runs in Redis, for `python -m producer runs`: each one's counts and where its shards are.

Read from the run registry (`keys.RUNS`) and each run's counters, recorded
shard homes (`contract/storage/shard_home.py`) and provenance (`contract/fleet/provenance.py`:
the models, SGLang and weight versions that made its samples): a few commands
per run, never a scan of the keyspace. In a run of several samples a prompt
(`enqueue --samples N`) `prompts` counts its distinct prompts, `samples` its
samples, which queued, done and dead count (as `status` does).
"""
from __future__ import annotations

import redis

from contract.keys import RUNS
from contract.ledger.ledger import Ledger
from contract.fleet.provenance import read_provenance
from contract.storage.shard_home import recorded
from contract.run.spec import OlderLayout, load_spec


def list_runs(client: redis.Redis) -> list[dict]:
    """One entry per run, by name: prompts, queued, done, dead, shards (recorded homes); a run
    this version does not read (an older layout) says so in `refused`."""
    found = []
    for name in sorted(raw.decode() for raw in client.smembers(RUNS)):
        entry = {"run": name, "prompts": 0, "queued": 0, "done": 0, "dead": 0, "shards": recorded(client, name)}
        try:
            spec = load_spec(client, name)
            if spec is None:
                continue
        except OlderLayout as exc:
            found.append(entry | {"refused": f"older layout: {exc}"})
            continue
        tally = Ledger(client, name).tally()
        origins = read_provenance(client, name)  # one read: its size is the run's servers, not its prompts
        samples = tally.queued + tally.done + tally.dead
        prompts = samples if spec.samples == 1 or tally.prompts is None else tally.prompts
        found.append(entry | {"prompts": prompts, "samples": samples, "samples_per_prompt": spec.samples,
                              "queued": tally.queued, "done": tally.done, "dead": tally.dead,
                              "models": sorted({o.model_path for o in origins if o.model_path}),
                              "sglang_versions": sorted({o.sglang_version for o in origins if o.sglang_version}),
                              "weight_versions": sorted({o.weight_version for o in origins})})
    return found
