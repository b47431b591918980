"""Provenance end to end: prompts from a `datasets` folder, a real Celery worker and a stand-in
that reports its own weight version and plants faults, then `export`'s dataset card."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from sglang_standin.config import DEFAULT_MODEL_PATH
from sglang_standin.routes_info import VERSION

from conftest import varied_prompts, write_prompts

WEIGHTS = "rl-step-42"
STANDIN = ["--output-len-max", "200", "--weight-version", WEIGHTS,
           "--fault-truncate", "0.15", "--fault-missing-think-end", "0.1"]


def test_a_run_records_what_made_its_samples_and_export_writes_the_card(fleet, tmp_path):
    datasets = pytest.importorskip("datasets")
    # Given 60 prompts saved as a Hugging Face dataset folder (its conversation in "question",
    # its id in "uid", an answer beside), a stand-in at weight version rl-step-42 that truncates
    # and drops think-ends in a share of its answers, and a real worker bound to it
    records = [{"uid": r["id"], "question": r.get("prompt") or f"q {r['id']}", "answer": "x"}
               for r in varied_prompts(60)]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ds"), num_shards=2)
    _, url = fleet.standin(*STANDIN)
    fleet.worker("w1", [url], FLEET_RETRY_BACKOFF="0.05")

    # When the folder is enqueued, the run finishes, and it is exported
    fleet.producer("enqueue", str(tmp_path / "ds"), "--messages-column", "question", "--id-column", "uid",
                   "--max-new-tokens", "150")
    states = fleet.wait_finished()
    status = json.loads(fleet.producer("status", "--json").stdout)
    stats = json.loads(fleet.producer("dead", "stats", "--json").stdout)
    fleet.producer("export", str(tmp_path / "export"))

    # Then every row of the dataset became a prompt, stored or dead-lettered with its reason
    assert sum(states.values()) == 60 and states.get("dead", 0) > 0 and states.get("done", 0) > 0
    assert set(stats) <= {"truncated", "missing_think_end"} and stats
    # And the run recorded the stand-in once: its URL, SGLang version, model and weight version
    (origin,) = status["provenance"]["servers"]
    assert (origin["server"], origin["sglang_version"], origin["model_path"], origin["weight_version"]) == \
        (url, VERSION, DEFAULT_MODEL_PATH, WEIGHTS)
    # And every stored row says which weights made it
    assert {r["weight_version"] for r in fleet.rows()} == {WEIGHTS}

    # And README.md beside the data names all of it, with the counts and dead letters by reason
    card = (tmp_path / "export" / "README.md").read_text()
    facts = yaml.safe_load(card.split("---\n", 2)[1])["reasoning_fleet"]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert facts["model_paths"] == [DEFAULT_MODEL_PATH] and facts["weight_versions"] == [WEIGHTS]
    assert facts["sglang_versions"] == [VERSION] and facts["servers"][0]["server"] == url
    assert facts["counts"]["prompts"] == 60 and facts["counts"]["rows_exported"] == manifest["rows"] == states["done"]
    assert facts["dead_letters"] == stats == manifest["dead_letters"]
    assert facts["tokenizer_fingerprint"] == manifest["tokenizer_fingerprint"]
    assert f"| {url} | {VERSION} | {DEFAULT_MODEL_PATH} |" in card
    for reason, count in stats.items():
        assert f"| {reason} | {count:,} |" in card
    exported = [i for f in manifest["files"] for i in pq.read_table(tmp_path / "export" / f["name"]).column("id").to_pylist()]
    assert len(exported) == len(set(exported)) == states["done"]


def test_two_weight_versions_are_both_recorded_and_each_row_names_its_own(fleet, tmp_path):
    # Given two servers of one model at different weight versions (as after an RL step pushed new
    # weights to one of them), and a worker bound to both
    servers = {fleet.standin("--weight-version", version, "--output-len-max", "80")[1]: version
               for version in ("step-1", "step-2")}
    fleet.worker("w1", list(servers))

    # When a JSONL run of 40 prompts finishes and is exported
    write_prompts(tmp_path / "p.jsonl", varied_prompts(40))
    fleet.producer("enqueue", str(tmp_path / "p.jsonl"), "--max-new-tokens", "100")
    assert fleet.wait_finished() == {"done": 40}
    fleet.producer("export", str(tmp_path / "export"))

    # Then each row's weight_version is its own server's
    rows = fleet.rows()
    assert all(r["weight_version"] == servers[r["server"]] for r in rows)
    # And the card lists each (server, weight version) the rows came from, and says the weights changed
    card = (tmp_path / "export" / "README.md").read_text()
    facts = yaml.safe_load(card.split("---\n", 2)[1])["reasoning_fleet"]
    used = {r["server"] for r in rows}
    assert {(s["server"], s["weight_version"]) for s in facts["servers"]} == {(u, servers[u]) for u in used}
    if len(used) == 2:
        assert "the weights changed during the run" in card


def test_weights_changed_mid_run_are_told_apart_row_by_row_and_in_the_card(fleet, tmp_path):
    import httpx

    # Given a server at weight version "before", a worker, and a first part of a run stored
    _, url = fleet.standin("--weight-version", "before", "--output-len-max", "60")
    fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "first.jsonl", varied_prompts(20))), "--max-new-tokens", "100")
    assert fleet.wait_finished() == {"done": 20}

    # When the server is given new weights ("after", as an RL loop does after /update_weights_from_disk), the
    # rest of the run is enqueued to the same worker, and the run is exported once finished
    changed = httpx.post(f"{url}/update_weight_version", json={"new_version": "after", "abort_all_requests": False})
    assert changed.status_code == 200, changed.text
    fleet.producer("enqueue", str(write_prompts(tmp_path / "rest.jsonl", varied_prompts(40, prefix="q"))),
                   "--max-new-tokens", "100")
    assert fleet.wait_finished() == {"done": 60}
    fleet.producer("export", str(tmp_path / "export"))

    # Then each row says which weights made it: the first part's "before", the rest's "after"
    versions = {r["id"]: r["weight_version"] for r in fleet.rows()}
    assert {v for k, v in versions.items() if k.startswith("p-")} == {"before"}
    assert {v for k, v in versions.items() if k.startswith("q-")} == {"after"}
    assert len(versions) == 60
    # And the card lists the server once per weight version, and says the weights changed
    card = (tmp_path / "export" / "README.md").read_text()
    facts = yaml.safe_load(card.split("---\n", 2)[1])["reasoning_fleet"]
    assert sorted((s["server"], s["weight_version"]) for s in facts["servers"]) == [(url, "after"), (url, "before")]
    assert "the weights changed during the run" in card
