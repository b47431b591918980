"""Feed exports through the trainers' own loading code and check what they yield, token for token.

Run it with a Python that has the trainers installed (not the project's .venv;
`scripts/trainers-venv.sh` builds `.trainers`, CPU only):

    .trainers/bin/python scripts/check_trainers.py --parquet P --specforge S --speculators Q --model TOKENIZER

P, S and Q are `export --format parquet|specforge|speculators` folders of one run;
TOKENIZER is the run's tokenizer folder (speculators' prepare-data loads it, for
decoding its sample print only). The truth is the Parquet export, the shards' own
rows: each row's expected ids are its `input_ids` and its expected mask
`[0] * prompt_len + [1] * output_len`.

- SpecForge 0.2.0: `specforge.data.prompt_builder.prepare_prompt_tasks`, the
  function its training runs call on `data.prompts_path` (pre-tokenized online
  data), with `max_length` = the manifest's `max_row_tokens` and the default
  minimum of 1 mask-1 token; it keeps file order, so row i is the file's i-th row
  that has a generated token, compared with that id's Parquet row.
- speculators 0.9.0: `speculators.data_generation.preprocessing.load_and_preprocess_dataset`
  (what `speculators prepare-data --data FILE` runs), saved with `save_to_disk` as
  prepare-data does, then read back by training's `speculators.train.data.ArrowDataset`;
  it shuffles and drops the ids, so the multiset of (ids, mask) it holds is compared
  with the Parquet rows'.

Rows with no generated token are dropped by both trainers; the check expects that
and counts them. Exit status 0 when every trainer yields exactly the expected rows.
Imports nothing of the project, so it runs in a venv holding only the trainers.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import pyarrow.parquet as pq


def expected_rows(parquet: Path) -> dict[str, tuple[list[int], list[int]]]:
    """line id -> (ids, mask) of every row of a Parquet export. A trainer's line names a sample of
    a run of several samples a prompt `<id>~<index>` (the ledger's key, `contract/run/samples.py`,
    spelled out here: this script imports nothing of the project)."""
    manifest = json.loads((parquet / "manifest.json").read_text())
    several = manifest.get("samples_per_prompt", 1) > 1
    rows = {}
    for entry in manifest["files"]:
        names = [c for c in ("id", "sample", "input_ids", "prompt_len", "output_len")
                 if c != "sample" or several]
        for row in pq.read_table(parquet / entry["name"], columns=names).to_pylist():
            name = f"{row['id']}~{row['sample'] or 0}" if several else row["id"]
            rows[name] = (row["input_ids"], [0] * row["prompt_len"] + [1] * row["output_len"])
    return rows


def exported_ids(folder: Path, name: str) -> list[str]:
    with open(folder / name, encoding="utf-8") as lines:
        return [json.loads(line)["id"] for line in lines]


def max_length(folder: Path) -> int:
    return max(1, json.loads((folder / "manifest.json").read_text())["format"]["max_row_tokens"])


def check_specforge(folder: Path, truth: dict) -> list[str]:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    path = folder / "specforge.jsonl"
    tasks = prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length(folder), is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None)
    ids = exported_ids(folder, "specforge.jsonl")
    kept = [i for i in ids if sum(truth[i][1]) >= 1]
    problems = _compare_sets(ids, truth, "specforge.jsonl")
    if len(tasks) != len(kept):
        problems.append(f"prepare_prompt_tasks yielded {len(tasks)} rows, expected {len(kept)}")
    equal = 0
    for prompt_id, task in zip(kept, tasks):
        got = (task["payload"]["input_ids"], task["payload"]["loss_mask"])
        if got == truth[prompt_id]:
            equal += 1
        else:
            problems.append(f"row {prompt_id!r}: {_difference(got, truth[prompt_id])}")
    print(f"specforge {version('specforge')} prepare_prompt_tasks: {len(tasks)} rows yielded, "
          f"{equal} equal token for token (ids and loss mask) "
          f"to the Parquet export; {len(ids) - len(kept)} rows without a generated token dropped by the trainer "
          f"(expected)")
    return problems


def check_speculators(folder: Path, truth: dict, model: str) -> list[str]:
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset
    from speculators.train.data import ArrowDataset

    ids = exported_ids(folder, "speculators.jsonl")
    problems = _compare_sets(ids, truth, "speculators.jsonl")
    with tempfile.TemporaryDirectory() as saved:
        dataset, _ = load_and_preprocess_dataset(model, [str(folder / "speculators.jsonl")], seq_length=max_length(folder),
                                                 build_dataset_num_proc=1, skip_token_freq=True, allow_empty_output=True)
        dataset.save_to_disk(saved)  # as `speculators prepare-data` does
        training = ArrowDataset(max_length(folder), saved, on_missing="raise")
        got = sorted((training.data[i]["input_ids"].tolist(), training.data[i]["loss_mask"].tolist())
                     for i in range(len(training)))
        lengths = list(training.data.with_format(None)["seq_len"])
    want = sorted(truth[i] for i in ids if sum(truth[i][1]) >= 1)
    equal = sum((Counter(_frozen(got)) & Counter(_frozen(want))).values())
    if got != want:
        problems.append(f"ArrowDataset holds {len(got)} rows, {equal} of the {len(want)} expected")
    if sorted(lengths) != sorted(len(row_ids) for row_ids, _ in got):
        problems.append("seq_len disagrees with the rows' lengths")
    print(f"speculators {version('speculators')} load_and_preprocess_dataset -> save_to_disk -> ArrowDataset: "
          f"{len(got)} rows, {equal} equal token for token (ids and loss mask) to the Parquet export (as a multiset: "
          f"the trainer shuffles); {len(ids) - len(want)} rows without a generated token dropped (expected)")
    return problems


def _frozen(rows: list) -> list[tuple]:
    return [(tuple(ids), tuple(mask)) for ids, mask in rows]


def _compare_sets(ids: list[str], truth: dict, name: str) -> list[str]:
    if sorted(ids) != sorted(truth):
        return [f"{name} holds {len(ids)} ids ({len(set(ids))} distinct), the Parquet export {len(truth)}"]
    return []


def _difference(got: tuple, want: tuple) -> str:
    for what, g, w in (("input_ids", got[0], want[0]), ("loss_mask", got[1], want[1])):
        if g != w:
            first = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return f"{what} differs at position {first} (lengths {len(g)} and {len(w)})"
    return "equal"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parquet", type=Path, required=True, help="export --format parquet of the run")
    parser.add_argument("--specforge", type=Path, help="export --format specforge of the same run")
    parser.add_argument("--speculators", type=Path, help="export --format speculators of the same run")
    parser.add_argument("--model", help="the run's tokenizer folder (speculators loads it)")
    args = parser.parse_args(argv)
    truth = expected_rows(args.parquet)
    print(f"Parquet export: {len(truth)} rows, {sum(sum(m) for _, m in truth.values())} generated tokens "
          f"(loss mask 1), {sum(len(m) - sum(m) for _, m in truth.values())} prompt tokens (loss mask 0)")
    problems = []
    if args.specforge:
        problems += check_specforge(args.specforge, truth)
    if args.speculators:
        if not args.model:
            parser.error("--speculators needs --model")
        problems += check_speculators(args.speculators, truth, args.model)
    for problem in problems:
        print(f"MISMATCH: {problem}")
    print("OK: every trainer yields exactly the exported ids and masks" if not problems else
          f"FAILED: {len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
