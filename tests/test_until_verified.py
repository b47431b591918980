"""Rejection sampling while the run goes on (`enqueue --samples N --until-verified K --verify NAME`), with
real processes: a prompt is sampled until K of its samples pass, at most N in all, a sample that fails
(or whose check errs) queuing the next of its chain (workers/intake/chains.py), and every sample is
stored exactly once, a worker SIGKILLed mid-chain included."""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import httpx
import redis

from contract.fleet import heartbeats

from conftest import ROOT, write_prompts
from test_verification import MAX_NEW_TOKENS, checks_folder, lines
from waiting import wait_until

N, K = 4, 2


def _stored(fleet, run: str = "default") -> Counter:
    return Counter((r["id"], r["sample"]) for r in fleet.rows(run))


def _enqueue(fleet, prompts, path: str) -> None:
    fleet.producer("enqueue", str(prompts), "--verify", "my_checks:grade", "--samples", str(N),
                   "--until-verified", str(K), "--max-new-tokens", str(MAX_NEW_TOKENS), PYTHONPATH=path)


def test_a_prompt_is_sampled_until_k_samples_pass_and_only_what_failed_is_sampled_again(fleet, tokenizer, tmp_path):
    # Given a worker and prompts whose every sample passes (right), fails (wrong) or errs in its check (raise)
    checks = checks_folder(tmp_path)
    path = f"{ROOT}{os.pathsep}{checks}"
    _, url = fleet.standin()
    fleet.worker("w1", [url], PYTHONPATH=path)
    prompts = write_prompts(tmp_path / "p.jsonl", lines(tokenizer, ["right", "right", "wrong", "raise"]))

    # When they are enqueued for at most 4 samples each, until 2 of a prompt's pass
    _enqueue(fleet, prompts, path)

    # Then a passing prompt stops at its first 2 samples, and the others get all 4, each stored once
    assert fleet.wait_finished() == {"done": 2 + 2 + 4 + 4}
    stored = _stored(fleet)
    assert set(stored.values()) == {1}
    assert {pid: sorted(n for p, n in stored if p == pid) for pid in ("q0", "q1", "q2", "q3")} == \
        {"q0": [0, 1], "q1": [0, 1], "q2": [0, 1, 2, 3], "q3": [0, 1, 2, 3]}
    assert fleet.dead_letters() == []
    # and status counts the samples spent per verified one
    status = json.loads(fleet.producer("status", "--json").stdout)
    assert (status["verification"]["passed"], status["verification"]["failed"], status["verification"]["error"]) \
        == (4, 4, 4)
    assert status["verification"]["samples_per_verified"] == 3.0
    # and an export of what passed holds each right prompt's two samples
    fleet.producer("export", str(tmp_path / "dest"), "--verified-only")
    manifest = json.loads((tmp_path / "dest" / "manifest.json").read_text())
    assert manifest["rows"] == 4 and manifest["left_out"] == {"verdict:error": 4, "verdict:fail": 4}


ENV = {"FLEET_LEASE_SECONDS": "6", "FLEET_RESTORE_INTERVAL": "2", "FLEET_CONCURRENCY": "4",
       "FLEET_MAX_INFLIGHT_PER_SERVER": "4"}


def test_a_worker_killed_mid_chain_leaves_every_chain_finished_and_each_sample_stored_once(fleet, tokenizer,
                                                                                           tmp_path):
    # Given chains running on a worker whose server never answers (its requests hang), holding samples
    checks = checks_folder(tmp_path)
    path = f"{ROOT}{os.pathsep}{checks}"
    _, hanging = fleet.standin("--fault-slow", "1", "--slow-seconds", "3600")
    _, good = fleet.standin("--step-base", "0.01")
    prompts = write_prompts(tmp_path / "p.jsonl", lines(tokenizer, ["right", "wrong", "wrong", "right"]))
    _enqueue(fleet, prompts, path)
    doomed = fleet.worker("doomed", [hanging], PYTHONPATH=path, **ENV)
    wait_until(lambda: len(httpx.get(f"{hanging}/standin/stats").json()["generating"]) >= 4, 120,
               "four samples generating on the doomed worker", fleet)
    fleet.worker("survivor", [good], PYTHONPATH=path, **ENV)
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: {"doomed", "survivor"} <= {r["worker"].split("@")[0] for r in heartbeats.read_all(client)},
               120, "both workers up", fleet)

    # When that worker is SIGKILLed
    doomed.signal(signal.SIGKILL)
    doomed.popen.wait(10)

    # Then the other finishes every chain: right prompts at 2 samples, wrong ones at 4, each sample stored
    # and generated once, none dead-lettered
    assert fleet.wait_finished(timeout=240) == {"done": 2 + 4 + 4 + 2}
    stored = _stored(fleet)
    assert set(stored.values()) == {1}
    assert sorted(stored) == sorted([("q0", 0), ("q0", 1), ("q3", 0), ("q3", 1)] +
                                    [(p, n) for p in ("q1", "q2") for n in range(N)])
    assert fleet.dead_letters() == []
    generated = httpx.get(f"{good}/standin/stats").json()["generations"]
    assert set(generated.values()) == {1} and len(generated) == 12


def test_a_dead_lettered_sample_moves_its_chain_on_like_a_failed_one(fleet, tokenizer, tmp_path):
    # Given a worker, and prompts whose every answer is cut by a budget of 4 tokens (each sample a
    # `truncated` dead letter, before any check)
    checks = checks_folder(tmp_path)
    path = f"{ROOT}{os.pathsep}{checks}"
    _, url = fleet.standin()
    fleet.worker("w1", [url], PYTHONPATH=path)
    prompts = write_prompts(tmp_path / "p.jsonl", lines(tokenizer, ["right", "wrong"]))

    # When they are enqueued for at most 4 samples each, until 2 pass
    fleet.producer("enqueue", str(prompts), "--verify", "my_checks:grade", "--samples", str(N),
                   "--until-verified", str(K), "--max-new-tokens", "4", PYTHONPATH=path)

    # Then every chain runs to its end: each prompt's 4 samples dead-lettered, each once, naming its sample
    assert fleet.wait_finished() == {"dead": 2 * N}
    letters = fleet.dead_letters()
    assert sorted((d["id"], d["sample"]) for d in letters) == [(p, n) for p in ("q0", "q1") for n in range(N)]
    assert {d["reason"] for d in letters} == {"truncated"}
