"""Where a run's shards are: the workers that write them say so in the run; commands read there.

A command that reads shards (`export`, `report`, `show`) may run on another
machine, or with another `OUTPUT_DIR` than the workers had; reading an empty
folder it would answer "0 samples" and exit 0. So each worker process notes its
`OUTPUT_DIR` in the run (`home`: a folder as an absolute path, or
`s3://bucket/prefix`), once per run, in the round trip that marks its first
group done (`workers/intake/reconcile.py`, the shard writer's one way to Redis); a
command reads the run's recorded home unless `OUTPUT_DIR` is set for it
(`producer/located.py`), and a command that finds fewer of the run's samples
than the ledger counts as done fails (`Shortfall`), saying how many, and where
it looked.
"""
from __future__ import annotations

from pathlib import Path

import redis

from contract.keys import RunKeys
from contract.storage import parse


def home(output_dir: str) -> str:
    """`OUTPUT_DIR` in the form that names the same place from anywhere: a folder resolved
    to an absolute path (`./shards` means nothing on another machine), a bucket as is."""
    scheme, bucket, path = parse(output_dir)
    if scheme == "file":
        return str(Path(path).expanduser().resolve())
    return f"s3://{bucket}/{path}".rstrip("/")


def record(pipe, run: str, where: str) -> None:
    """Note (in a pipeline) that shards of `run` are written under `where`."""
    pipe.sadd(RunKeys(run).shard_homes, where)


def recorded(client: redis.Redis, run: str) -> list[str]:
    """Every place the run's workers have written its shards, sorted."""
    return sorted(raw.decode() for raw in client.smembers(RunKeys(run).shard_homes))


class Shortfall(LookupError):
    """Fewer samples found than the ledger counts as done: the shards were read in the wrong
    place, or some are gone. Never a count to print, nor exit status 0."""

    def __init__(self, run: str, done: int, found: int, where: str, what: str = "samples"):
        super().__init__(f"run {run!r}: the ledger counts {done:,} {what} done, but {found:,} were found "
                         f"in the shards under {where}; set OUTPUT_DIR to where the workers wrote them "
                         f"(python -m producer runs lists each run's)")
        self.done, self.found, self.where = done, found, where


def check_found(run: str, done: int, found: int, where: str) -> None:
    """Raise `Shortfall` when `found` falls short of `done`."""
    if found < done:
        raise Shortfall(run, done, found, where)
