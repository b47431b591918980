"""Which `OUTPUT_DIR` a command reads a run's shards from.

`OUTPUT_DIR`, when it is set for the command (in the environment): the user
says where the shards are from here (a shared folder mounted elsewhere, say).
Otherwise the place the run's workers recorded (`contract/storage/shard_home.py`), so
that `export`, `report` and `show` work from any machine that reaches Redis
and the shared storage. A run with no shard written yet has no record: the
default then, which can hold none of its samples either.
"""
from __future__ import annotations

import redis

from contract.settings import SharedSettings
from contract.storage.shard_home import recorded
from contract.run.spec import RunSpec


class SeveralHomes(LookupError):
    """The run's workers wrote its shards to more than one place (node-local disks, say)."""


def shards_at(settings: SharedSettings, client: redis.Redis, spec: RunSpec) -> str:
    """The `OUTPUT_DIR` to read `spec`'s shards from (raises `SeveralHomes` when the run
    recorded several and `OUTPUT_DIR` does not choose)."""
    if "output_dir" in settings.model_fields_set:
        return settings.output_dir
    homes = recorded(client, spec.name)
    if len(homes) > 1:
        raise SeveralHomes(f"run {spec.name!r} has shards in {len(homes)} places ({', '.join(homes)}): "
                           "set OUTPUT_DIR to the one to read (each holds only its workers' samples)")
    return homes[0] if homes else settings.output_dir
