"""Provenance: what made a run's samples, recorded once per server and weight version, and the
dataset card `export` writes beside the data (against a real redis-server)."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
import yaml

from contract.ledger.codec import pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.keys import RunKeys
from contract.ledger.ledger import Ledger
from contract.fleet.provenance import Origin, Recorder, read_provenance, weight_version_of
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec
from producer.card import render_card
from producer.export import export_run
from workers.servers.bindings import ServerBinding
from workers.servers.server_info import Info, apply_info

RUN = "prov"


def hsetnx_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0))


def _record(recorder: Recorder, client, *origin) -> None:
    recorder.observe(RUN, *origin)
    recorder.flush(client)


def test_a_worker_records_each_server_and_weight_version_once_whatever_the_samples(client):
    # Given a worker's recorder
    recorder = Recorder("w1")
    before = hsetnx_calls(client)

    # When 1,000 answers come from one server with one weight version, then the weights change
    for _ in range(1000):
        recorder.observe(RUN, "http://s1:30000", "default", "0.5.23", "m/path", "m")
        recorder.flush(client)
    for _ in range(500):
        recorder.observe(RUN, "http://s1:30000", "step-200", "0.5.23", "m/path", "m")
        recorder.flush(client)

    # Then Redis was written twice, once per distinct weight version (flat in the samples)
    assert hsetnx_calls(client) - before == 2
    origins = read_provenance(client, RUN)
    assert [(o.server, o.weight_version, o.sglang_version, o.model_path, o.worker) for o in origins] == [
        ("http://s1:30000", "default", "0.5.23", "m/path", "w1"),
        ("http://s1:30000", "step-200", "0.5.23", "m/path", "w1")]


def test_the_first_worker_to_see_an_origin_keeps_it(client):
    # Given an origin another worker recorded first
    _record(Recorder("first"), client, "http://s1:30000", "default", "0.5.23", "m", "m")
    (first,) = read_provenance(client, RUN)

    # When a second worker sees the same server with the same weights
    _record(Recorder("second"), client, "http://s1:30000", "default", "0.5.23", "m", "m")

    # Then the entry is the first worker's, with its first_seen
    assert read_provenance(client, RUN) == [first] and first.worker == "first"


def test_a_write_that_fails_is_tried_again_after_the_next_sample(client):
    # Given a recorder whose first write finds Redis away
    recorder = Recorder("w")
    away = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert recorder.observe(RUN, "http://s:1", "default", None, None, None)
    with pytest.raises(redis.ConnectionError):
        recorder.flush(away)

    # When the next sample is settled with Redis back (its answer seen before), Then the origin is written
    assert not recorder.observe(RUN, "http://s:1", "default", None, None, None)
    assert recorder.flush(client) == 1
    assert [o.server for o in read_provenance(client, RUN)] == ["http://s:1"]


def test_noting_an_origin_sends_no_command_and_writing_waits_for_the_flush(client):
    # Given a recorder that notes an answer's origin (on the sample's way to its shard)
    recorder, before = Recorder("w"), hsetnx_calls(client)
    recorder.observe(RUN, "http://s:1", "default", None, None, None)
    # Then Redis holds nothing of it until the flush
    assert hsetnx_calls(client) == before and read_provenance(client, RUN) == []
    recorder.flush(client)
    assert [o.server for o in read_provenance(client, RUN)] == ["http://s:1"]


def test_an_answers_weight_version_wins_over_the_servers_and_unknown_is_said():
    assert weight_version_of({"weight_version": "v2"}, "v1") == "v2"
    assert weight_version_of({}, "v1") == "v1"
    assert weight_version_of(None, None) == "unknown"


def test_the_preflight_reads_the_sglang_version_and_the_weight_version():
    # Given a server's info routes as SGLang 0.5.23 answers them
    binding = ServerBinding("http://s:30000")
    info = {"model_info": Info("/model_info", 200, {"model_path": "m", "weight_version": "default",
                                                    "is_generation": True}),
            "server_info": Info("/server_info", 200, {"version": "0.5.23", "weight_version": "default"}),
            "models": Info("/v1/models", 200, {"data": [{"max_model_len": 4096}]})}

    # When the preflight judges it
    apply_info(binding, info, key_sent=False)

    # Then the binding holds both versions, and its snapshot (the heartbeat) shows them
    assert (binding.sglang_version, binding.weight_version) == ("0.5.23", "default")
    assert binding.snapshot()["sglang_version"] == "0.5.23"


def spec(**more) -> RunSpec:
    return RunSpec(name=RUN, tokenizer="deepseek-bundled", tokenizer_fingerprint="tokfp", template_fingerprint="tplfp",
                   sampling={"max_new_tokens": 8, "temperature": 0.6, "top_p": 0.95}, thinking="prompt",
                   think_start_id=1, think_end_id=2, stop_ids=[3], **more)


ORIGINS = [Origin("http://s1:30000", "default", "0.5.23", "org/model", "org/model", 1.8e9, "w1"),
           Origin("http://s2:30000", "step-2", "0.5.23", "org/model", "org/model", 1.8e9 + 60, "w2")]


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def test_the_card_names_servers_versions_fingerprints_sampling_counts_and_verdicts():
    # Given a run of 2 samples a prompt with a verifier, its counters with dead letters and verdicts
    counters = {"enqueued": 20, "state:done": 16, "state:dead": 4, "reason:truncated": 3,
                "reason:missing_think_end": 1, "verdict:pass": 12, "verdict:fail": 4, "prompt_tokens": 200}
    manifest = {"rows": 16, "prompts": 10, "exported_at": 1.8e9, "files": [{"name": "part-0-00000.parquet", "rows": 16}]}

    # When its card is rendered
    card = render_card(spec(samples=2, verify="math"), manifest, ORIGINS, counters)

    # Then the front matter is YAML a hub reads: the data files, and the facts under reasoning_fleet
    meta = front_matter(card)
    assert meta["configs"][0]["data_files"][0]["path"] == ["part-0-00000.parquet"]
    facts = meta["reasoning_fleet"]
    assert facts["weight_versions"] == ["default", "step-2"] and facts["sglang_versions"] == ["0.5.23"]
    assert facts["counts"]["prompts"] == 10 and facts["counts"]["rows_exported"] == 16
    assert facts["dead_letters"] == {"missing_think_end": 1, "truncated": 3}
    assert facts["verdicts"] == {"fail": 4, "pass": 12} and facts["verifier"] == "math"
    assert facts["samples_per_prompt"] == 2 and "sha256" in facts["seed_rule"]
    # And the prose says the same for a person: servers, a weight change, fingerprints, dead letters, verdicts
    assert "| http://s1:30000 | 0.5.23 | org/model | org/model | default |" in card
    assert "the weights changed during the run" in card
    assert "`tokfp`" in card and "`tplfp`" in card and '"temperature": 0.6' in card
    assert "| truncated | 3 |" in card and "| pass | 12 |" in card


def test_a_card_without_verdicts_or_servers_says_so_and_still_parses():
    # Given a run whose counters hold no verdicts, and no provenance (an older run)
    card = render_card(spec(), {"rows": 0, "files": []}, [], {"enqueued": 1, "state:queued": 1})

    # Then the card has no verdict table, says no server was recorded, and its front matter parses
    assert "| verdict |" not in card and "No server was recorded" in card
    assert front_matter(card)["reasoning_fleet"]["verdicts"] == {}


def sample(prompt_id: str) -> Sample:
    now = datetime.now(timezone.utc)
    return Sample(id=prompt_id, input_ids=[1, 2, 3], prompt_len=2, output_len=1, finish_reason="stop",
                  stop_token=3, think_end_index=2, run=RUN, server="http://s1:30000", model="org/model",
                  max_new_tokens=8, temperature=0.6, top_p=0.95, attempts=1, worker="w",
                  tokenizer_fingerprint="tokfp", template_fingerprint="tplfp", e2e_latency=0.1, started_at=now,
                  finished_at=now, weight_version="default")


def test_export_writes_the_card_beside_the_data_and_exports_again_over_it(client, tmp_path):
    # Given a run with three done prompts, one dead letter, and its provenance
    ledger = Ledger(client, RUN)
    ledger.enqueue({f"p{i}": pack_ids([1, 2]) for i in range(4)}, 1)
    shards = tmp_path / "shards" / RUN
    shards.mkdir(parents=True)
    pq.write_table(samples_to_table([sample(f"p{i}") for i in range(3)]), shards / "part-a.parquet")
    for i in range(3):
        ledger.mark_done(f"p{i}", 1, shards / "part-a.parquet")
    DeadLetters(client, RUN).put(DeadLetter(id="p3", run=RUN, reason="truncated", message="m", attempts=1,
                                            servers=[], worker="w", prompt_b64="", prompt_tokens=2, sampling={}))
    _record(Recorder("w"), client, "http://s1:30000", "default", "0.5.23", "org/model", "org/model")

    # When it is exported, twice into the same folder
    for _ in range(2):
        manifest = export_run(spec(), client, str(tmp_path / "shards"), tmp_path / "dest")

    # Then README.md is beside the data, and the manifest carries the same provenance
    card = (tmp_path / "dest" / "README.md").read_text()
    facts = front_matter(card)["reasoning_fleet"]
    assert facts["counts"]["rows_exported"] == 3 and facts["dead_letters"] == {"truncated": 1}
    assert facts["servers"][0]["sglang_version"] == "0.5.23"
    assert manifest["provenance"]["weight_versions"] == ["default"]
    assert json.loads((tmp_path / "dest" / "manifest.json").read_text())["provenance"]["model_paths"] == ["org/model"]
    # And the rows carry the weight version column
    table = pq.read_table(next((tmp_path / "dest").glob("part-*.parquet")))
    assert set(table.column("weight_version").to_pylist()) == {"default"}
    assert client.exists(RunKeys(RUN).provenance)


def test_runs_names_the_models_sglang_and_weight_versions_of_each_run(client):
    from contract.run.spec import save_spec
    from producer.runs import list_runs

    # Given a run whose samples came from two weight versions of one model
    save_spec(client, spec())
    for weights in ("default", "step-2"):
        _record(Recorder("w"), client, "http://s1:30000", weights, "0.5.23", "org/model", "org/model")

    # When the runs are listed, Then the run's entry names them
    (entry,) = list_runs(client)
    assert (entry["models"], entry["sglang_versions"], entry["weight_versions"]) == \
        (["org/model"], ["0.5.23"], ["default", "step-2"])


def test_the_front_matter_reads_back_as_the_same_data_whatever_the_values():
    from producer.card import _yaml

    # Given facts with values YAML could misread (a float in exponent form, text with a colon,
    # a key with a dash, empty containers, nulls, non-ASCII text)
    facts = {"sampling": {"temperature": 1e-06, "top_p": 0.95, "max_new_tokens": 8},
             "tags": ["a: b", "#not a comment", "- dash"], "k-1": True, "none": None, "empty": {}, "list": [],
             "servers": [{"server": "http://h:1", "weight_version": "2026-01-01"}], "name": "caf\u00e9 \u2713"}

    # When written as the card's front matter, Then YAML reads back exactly the same data
    assert yaml.safe_load(_yaml(facts)) == facts
