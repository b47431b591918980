"""Build a run's report: read once, compute the figures, draw, lay out, write one file.

The order matters only for a run still going: the ledger's counts are read
first, then the shards, then the dead letters, so the shards can only hold
more than the ledger said (the page says when they differ); fewer is a fault
(`contract.storage.shard_home.Shortfall`), and no page is written.
"""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import redis

from contract.ledger.deadletters import DeadLetters
from contract.storage.shard_home import check_found
from contract.storage import store_for
from contract.run.spec import RunSpec

from ..show import find_samples, letter_view, load_decoder, sample_view
from .charts import CHARTS, draw
from .figures import figures, repeated_hashes
from .letters import LetterTally
from .page import page
from .read import dead_letters, shard_batches
from .samples import EXAMPLES, SampleTally, output_hashes, row_keys
from .tally import Picks

SECTION_LIMIT = 600  # tokens a section shows on the page (head and tail); `show` prints all


def build_report(client: redis.Redis, spec: RunSpec, output_dir: str, queue_prefix: str, out: Path,
                 trust_remote_code: bool = False) -> dict:
    """Write the report to `out` (atomically) and return its figures."""
    from ..status import collect_status

    status = collect_status(client, spec, queue_prefix)
    samples, letters = SampleTally(spec), LetterTally(spec)
    for batch in shard_batches(output_dir, spec.name):
        samples.add(batch)
    for letter in dead_letters(client, spec.name):
        letters.add(letter)
    data = figures(samples, letters, spec)
    # read after the ledger's counts, the shards hold at least its done samples; fewer: the
    # shards were read in the wrong place, or some are gone, and no page is written
    check_found(spec.name, status["done"], data["samples"]["unique_ids"], store_for(output_dir).where(spec.name))
    repeated = repeated_hashes(samples)
    if repeated:
        data["examples"]["repeated"] = _repeated_ids(output_dir, spec, repeated)
    built = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "shards": len(store_for(output_dir).shards(spec.name)), "folder": store_for(output_dir).where(spec.name)}
    charts = [(chart, *draw(chart, data)) for chart in CHARTS]
    examples = _examples(client, spec, output_dir, data["examples"], trust_remote_code)
    _write(out, page(spec, status, data, charts, examples, built))
    return data


def _repeated_ids(output_dir: str, spec: RunSpec, hashes: set[int]) -> list[str]:
    """A second pass, only when some output repeats: the smallest ids (ledger keys) among the repeated outputs."""
    picks = Picks(EXAMPLES)
    for batch in shard_batches(output_dir, spec.name, columns=("id", "prompt_len", "input_ids", "sample")):
        pairs = output_hashes(batch, spec.samples)
        ids = row_keys(batch, spec.samples)
        for row in range(batch.num_rows):
            if int(pairs[row, 0]) in hashes:
                picks.offer(0, ids[row])
    return picks.ids()


def _examples(client: redis.Redis, spec: RunSpec, output_dir: str, buckets: dict[str, list[str]],
              trust_remote_code: bool) -> list[dict]:
    """Each example id once, with the buckets it stands for and what `show` shows of it."""
    where: dict[str, list[str]] = {}
    for bucket, ids in buckets.items():
        for prompt_id in ids:
            where.setdefault(prompt_id, []).append(bucket)
    if not where:
        return []
    decoder = load_decoder(spec, trust_remote_code)
    stored = find_samples(output_dir, spec.name, [i for i, b in where.items() if not b[0].startswith("dead:")],
                          spec.samples)
    letters = DeadLetters(client, spec.name)
    examples = []
    for prompt_id, names in where.items():
        if prompt_id in stored:
            shown = sample_view(stored[prompt_id], spec)
        else:
            letter = letters.get(prompt_id)
            if letter is None:  # requeued and stored since it was counted
                continue
            shown = letter_view(letter, spec)
        examples.append({"id": prompt_id, "buckets": names, "shown": shown, "decoder": decoder,
                         "limit": SECTION_LIMIT})
    return examples


def _write(out: Path, text: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp{os.getpid()}")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(out)
