"""A line's own sampling and `--logprobs K`, through real processes: the producer, Redis, a Celery
worker and the SGLang stand-in, which records what each request asked (`/standin/stats` `asked`)."""
from __future__ import annotations

import httpx
import pyarrow.parquet as pq

from conftest import write_prompts

RUN = ["--max-new-tokens", "4096", "--temperature", "0.6", "--top-p", "0.95"]
RUN_SAMPLING = {"max_new_tokens": 4096, "temperature": 0.6, "top_p": 0.95, "skip_special_tokens": False}


def asked(url: str) -> dict:
    return httpx.get(f"{url}/standin/stats", timeout=10).json()["asked"]


def test_two_lines_are_sent_and_stored_with_their_own_sampling_and_a_bad_one_is_refused_by_number(fleet, tmp_path):
    # Given a stand-in, a worker, and a file: two lines with a sampling of their own (one with a seed),
    # a plain one, and one whose top_p SGLang would refuse
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    prompts = write_prompts(tmp_path / "p.jsonl", [
        {"id": "greedy", "prompt": "What is 12 * 13?", "sampling": {"temperature": 0, "top_k": 1, "max_new_tokens": 500}},
        {"id": "seeded", "prompt": "Why is the sky blue?", "sampling": {"top_p": 0.5, "min_p": 0.1, "seed": 1234}},
        {"id": "plain", "prompt": "Count to five."},
        {"id": "bad", "prompt": "Say hello.", "sampling": {"top_p": 2}},
    ])

    # When the run is enqueued with its own sampling, and the fleet drains it
    result = fleet.producer("enqueue", str(prompts), *RUN, check=False)
    states = fleet.wait_finished()

    # Then the bad line is reported with its number and reason (exit 1), the three others stored
    assert result.returncode == 1 and "line 4: sampling.top_p must be in (0, 1], got 2" in result.stderr, result
    assert states == {"done": 3}
    # And each request asked exactly the run's sampling with the line's own keys over it; the seed as
    # SGLang's sampling_seed
    sent = {pid: a["sampling_params"] for pid, a in asked(url).items()}
    assert sent["greedy"] == {**RUN_SAMPLING, "temperature": 0, "top_k": 1, "max_new_tokens": 500}
    assert sent["seeded"] == {**RUN_SAMPLING, "top_p": 0.5, "min_p": 0.1, "sampling_seed": 1234}
    assert sent["plain"] == RUN_SAMPLING and "bad" not in sent
    # And each row says what it was sampled with
    rows = {r["id"]: r for r in fleet.rows()}
    shown = {pid: (r["max_new_tokens"], round(r["temperature"], 3), round(r["top_p"], 3), r["top_k"],
                   None if r["min_p"] is None else round(r["min_p"], 3)) for pid, r in rows.items()}
    assert shown == {"greedy": (500, 0.0, 0.95, 1, None), "seeded": (4096, 0.6, 0.5, None, 0.1),
                     "plain": (4096, 0.6, 0.95, None, None)}
    assert all(r["logprobs"] is None for r in rows.values())


def test_a_logprobs_run_stores_k_log_probabilities_a_token_and_exports_them(fleet, tmp_path):
    # Given a stand-in, a worker and three prompts
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"What is {i} + {i}?"} for i in range(3)])

    # When they are enqueued with --logprobs 3, generated, and exported
    fleet.producer("enqueue", str(prompts), "--logprobs", "3", *RUN)
    assert fleet.wait_finished() == {"done": 3}
    fleet.producer("export", str(tmp_path / "dataset"))

    # Then every request asked for the top 3 of the output tokens only
    for a in asked(url).values():
        assert (a["return_logprob"], a["top_logprobs_num"], a["logprob_start_len"]) == (True, 3, -1)
    # And every row holds one log-probability per output token and 3 candidates per token, the
    # produced token among them (the stand-in's most likely one)
    rows = fleet.rows()
    assert len(rows) == 3
    for row in rows:
        n, output = row["output_len"], row["input_ids"][row["prompt_len"]:]
        assert n > 0 and len(row["logprobs"]) == n
        assert len(row["top_logprob_ids"]) == len(row["top_logprobs"]) == 3 * n
        assert row["top_logprob_ids"][0::3] == output
        assert all(lp <= 0 for lp in row["logprobs"])
    # And `show` sums them up in one line, never prints the lists
    shown = fleet.producer("show", "q0").stdout
    assert "top 3 a token for" in shown and "mean log-probability of the tokens" in shown and len(shown) < 50_000
    # And the export keeps them as stored
    exported = {r["id"]: r for f in sorted((tmp_path / "dataset").glob("*.parquet"))
                for r in pq.read_table(f).to_pylist()}
    for row in rows:
        got = exported[row["id"]]
        assert (got["logprobs"], got["top_logprob_ids"], got["top_logprobs"]) == \
            (row["logprobs"], row["top_logprob_ids"], row["top_logprobs"])
