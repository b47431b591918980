"""Several samples of each prompt (`enqueue --samples N`), through real processes.

A real redis-server, SGLang stand-ins (which note the `sampling_seed` of every
generation they start, `/standin/stats`), `celery -A workers worker`
processes and the producer's commands. What a user checks: every (id,
sample) stored exactly once with the seed its run, prompt and index give, the
export holding each once, `status` counting prompts and samples; and, with a
worker SIGKILLed while samples of a prompt are in flight on it, every sample
still stored exactly once, none dead-lettered, each generated once by the
worker that took over. The in-process rules are tests/specs/test_samples.py.
"""
from __future__ import annotations

import json
import signal
import time
from collections import Counter

import httpx
import pyarrow.parquet as pq
import redis

from contract.fleet import heartbeats
from contract.run.samples import resample_seed, sample_seed
from sglang_standin.cli import parse_config
from sglang_standin.outputs import fault_for, for_seed, generate_output

from conftest import messages_of, render, varied_prompts, write_prompts
from waiting import wait_until

SAMPLES = 3
MAX_NEW_TOKENS = 4096


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()


def _keys(records: list[dict]) -> set[str]:
    return {f"{r['id']}~{n}" for r in records for n in range(SAMPLES)}


def _stored(fleet) -> Counter:
    return Counter((r["id"], r["sample"]) for r in fleet.rows())


def test_every_sample_of_every_prompt_is_stored_once_with_its_own_seed(fleet, tokenizer, tmp_path):
    # Given two stand-ins that draw each answer with its request's seed (as a real model's samples
    # differ), a real worker bound to both, and five prompts
    _, url_a = fleet.standin("--seeded-outputs")
    _, url_b = fleet.standin("--seeded-outputs")
    fleet.worker("w1", [url_a, url_b])
    records = varied_prompts(5)
    prompts = write_prompts(tmp_path / "p.jsonl", records)

    # When they are enqueued with 3 samples each and the fleet drains the queue
    fleet.producer("enqueue", str(prompts), "--samples", str(SAMPLES), "--max-new-tokens", str(MAX_NEW_TOKENS))
    assert fleet.wait_finished() == {"done": 15}

    # Then every (id, sample) is stored exactly once, nothing is dead-lettered...
    rows = fleet.rows()
    assert Counter((r["id"], r["sample"]) for r in rows) == {(r["id"], n): 1 for r in records for n in range(SAMPLES)}
    assert fleet.dead_letters() == []
    # ...each row with the seed its run, prompt and index give, which is the seed the server was sent
    assert all(r["seed"] == sample_seed("default", r["id"], r["sample"]) for r in rows)
    sent = {k: v for url in (url_a, url_b) for k, v in _stats(url)["seeds"].items()}
    assert sent == {f"{r['id']}~{r['sample']}": [r["seed"]] for r in rows}
    # ...and each holds its prompt's exact tokens and the server's answer to them with its seed, so the
    # samples of a prompt differ
    standin = parse_config(["--port", "1", "--seeded-outputs"])
    for record in records:
        prompt_ids = render(tokenizer, messages_of(record))
        mine = [r for r in rows if r["id"] == record["id"]]
        for row in mine:
            output_ids, _ = generate_output(prompt_ids, MAX_NEW_TOKENS, for_seed(standin, row["seed"]))
            assert row["input_ids"] == prompt_ids + output_ids and row["prompt_len"] == len(prompt_ids)
        assert len({tuple(r["input_ids"]) for r in mine}) == SAMPLES
    # the samples of a prompt went to one server (its prefix's) while the load guard allowed
    servers = {record["id"]: {r["server"] for r in rows if r["id"] == record["id"]} for record in records}
    assert sum(len(s) == 1 for s in servers.values()) >= 4, servers

    # When the run's status is read and the run is exported
    status = json.loads(fleet.producer("status", "--json").stdout)
    said = fleet.producer("export", str(tmp_path / "dest")).stdout

    # Then status counts 5 prompts and 15 samples, all done, and the export holds each (id, sample) once
    assert (status["prompts"], status["samples"], status["done"], status["samples_per_prompt"]) == (5, 15, 15, 3)
    exported = [row for f in sorted((tmp_path / "dest").glob("part-*.parquet")) for row in pq.read_table(f).to_pylist()]
    assert sorted((r["id"], r["sample"]) for r in exported) == sorted((r["id"], n) for r in records for n in range(3))
    manifest = json.loads((tmp_path / "dest" / "manifest.json").read_text())
    assert (manifest["rows"], manifest["prompts"], manifest["samples_per_prompt"]) == (15, 5, 3)
    assert "exported 15 samples of 5 prompts (3 samples a prompt)" in " ".join(said.split())

    # and exported for SpecForge, each sample is a line of its own name (`<id>~<index>`), holding its
    # stored row's tokens
    fleet.producer("export", str(tmp_path / "specforge"), "--format", "specforge")
    lines = [json.loads(line) for line in (tmp_path / "specforge" / "specforge.jsonl").read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(_keys(records))
    stored = {f"{r['id']}~{r['sample']}": r["input_ids"] for r in rows}
    assert all(line["input_ids"] == stored[line["id"]] for line in lines)

    # and `show` decodes one sample of a prompt
    shown = fleet.producer("show", "p-0002", "--sample", "2").stdout
    assert "sample 2 of prompt p-0002" in shown and str(sample_seed("default", "p-0002", 2)) in shown

    # and the run's report counts every sample once (a prompt's samples are no redelivery), 5 prompts, 15 samples
    said = " ".join(fleet.producer("report", "--out", str(tmp_path / "report.html")).stdout.split())
    assert "(15 samples, 0 dead letters)" in said
    page = (tmp_path / "report.html").read_text()
    assert "samples (3 a prompt)" in page and "The shards hold" not in page


# A dead worker's lease (tests/intake/test_worker_deaths.py): its samples are back on the queue
# within 1.25 leases, a restore interval and a heartbeat's life, plus slack for a loaded machine.
LEASE_S = 6.0
ENV = {"FLEET_LEASE_SECONDS": str(int(LEASE_S)), "FLEET_RESTORE_INTERVAL": "2",
       "FLEET_CONCURRENCY": "4", "FLEET_MAX_INFLIGHT_PER_SERVER": "4"}
WITHIN = 1.25 * LEASE_S + 2 + 8 + 10


def test_a_worker_killed_with_samples_of_a_prompt_in_flight_leaves_each_sample_stored_once(fleet, tmp_path):
    # Given two prompts of 3 samples each, and a worker whose requests hang on its server (a generation
    # that never returns), holding at least two samples of one prompt in flight there
    _, hanging = fleet.standin("--fault-slow", "1", "--slow-seconds", "3600")
    _, good = fleet.standin("--step-base", "0.01")
    records = varied_prompts(2)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--samples", str(SAMPLES))
    doomed = fleet.worker("doomed", [hanging], **ENV)

    def two_of_one_prompt() -> bool:
        generating = Counter(key.rpartition("~")[0] for key in _stats(hanging)["generating"])
        return max(generating.values(), default=0) >= 2
    wait_until(two_of_one_prompt, 120, "two samples of one prompt generating on the doomed worker", fleet)
    survivor = fleet.worker("survivor", [good], **ENV)
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: {"doomed", "survivor"} <= {r["worker"].split("@")[0] for r in heartbeats.read_all(client)},
               120, "both workers up", fleet)
    held = set(_stats(hanging)["generating"])

    # When that worker is SIGKILLed (the OOM killer)
    doomed.signal(signal.SIGKILL)
    doomed.popen.wait(10)
    killed = time.monotonic()

    # Then the other stores every sample exactly once, within the bound of a lease, none dead-lettered,
    # each generated once there with its own seed, the killed worker's among them
    wait_until(lambda: set(_stored(fleet)) == {(r["id"], n) for r in records for n in range(SAMPLES)},
               WITHIN + 60, "every sample stored", fleet, poll=0.25)
    took = time.monotonic() - killed
    assert fleet.wait_finished(timeout=30) == {"done": 6}
    assert set(_stored(fleet).values()) == {1}
    assert fleet.dead_letters() == []
    generated = _stats(good)
    assert generated["generations"] == {key: 1 for key in _keys(records)}
    assert held <= set(generated["generations"])
    assert generated["seeds"] == {k: [sample_seed("default", *_split(k))] for k in _keys(records)}
    assert took < WITHIN, f"the killed worker's samples took {took:.1f}s to be stored (bound {WITHIN:.0f}s)"
    print(f"\nFIGURE {len(held)} samples in flight on the killed worker; every sample stored once "
          f"{took:.1f}s after the kill (bound {WITHIN:.0f}s)")


def _split(key: str) -> tuple[str, int]:
    prompt, _, index = key.rpartition("~")
    return prompt, int(index)


def test_a_sample_resampled_after_failing_its_checks_asks_another_seed_and_keeps_the_answer_drawn_with_it(
        fleet, tokenizer, tmp_path):
    # Given a stand-in that draws each answer with its request's seed and leaves `</think>` out of half of
    # them, and a worker that sends a sample failing its think checks once more (FLEET_RESAMPLE_ON_VERIFY_FAILURE)
    options = ("--seeded-outputs", "--fault-missing-think-end", "0.5")
    _, url = fleet.standin(*options)
    fleet.worker("w1", [url], FLEET_RESAMPLE_ON_VERIFY_FAILURE="true")
    records = varied_prompts(8)
    # (what the stand-in answers each seed is known beforehand: which first answers fail, which resamples pass)
    standin = parse_config(["--port", "1", *options])
    asked, fails_again = {}, set()
    for record in records:
        prompt_ids = render(tokenizer, messages_of(record))
        for n in range(2):
            seed = sample_seed("default", record["id"], n)
            if fault_for(prompt_ids, for_seed(standin, seed)) != "missing_think_end":
                asked[f"{record['id']}~{n}"] = [seed]
                continue
            asked[f"{record['id']}~{n}"] = [seed, resample_seed(seed)]
            if fault_for(prompt_ids, for_seed(standin, resample_seed(seed))) == "missing_think_end":
                fails_again.add((record["id"], n))
    resampled = {tuple(k.rsplit("~", 1)) for k, seeds in asked.items() if len(seeds) == 2}
    assert len(resampled) > len(fails_again) > 0, "the prompts must hold resamples that pass and that fail again"

    # When they are enqueued with 2 samples each and the fleet drains the queue
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--samples", "2",
                   "--max-new-tokens", str(MAX_NEW_TOKENS))
    fleet.wait_finished()

    # Then each sample was asked with its own seed, and one that failed once more with another (not the same
    # seed again, which a deterministic server answers alike)
    assert _stats(url)["seeds"] == asked
    # and a resample that passed is stored with the seed its answer was drawn with, one that failed again is a
    # dead letter of its reason
    rows = {(r["id"], r["sample"]): r for r in fleet.rows()}
    assert set(rows) == {(r["id"], n) for r in records for n in range(2)} - fails_again
    assert all(row["seed"] == asked[f"{key[0]}~{key[1]}"][-1] for key, row in rows.items())
    for (prompt_id, n), row in rows.items():
        prompt_ids = render(tokenizer, messages_of(next(r for r in records if r["id"] == prompt_id)))
        output_ids, _ = generate_output(prompt_ids, MAX_NEW_TOKENS, for_seed(standin, row["seed"]))
        assert row["input_ids"] == prompt_ids + output_ids
    letters = fleet.dead_letters()
    assert {(d["id"], d["sample"]) for d in letters} == fails_again
    assert {d["reason"] for d in letters} == {"missing_think_end"}
