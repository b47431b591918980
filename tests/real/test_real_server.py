"""A worker bound to the real SGLang server (its CPU engine, tests/real_sglang.py): samples equal to the
server's own answers, token for token, and the think check, shards and exports through the real engine,
for a reasoning template and one without thinking; a line's own sampling and `--logprobs K` answered by
the real engine."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from conftest import varied_prompts, write_prompts
from contract.chat.bundled import bundled_tokenizer_dir
from real_sglang import ASSISTANT, THINK_END, expected_trace

pytestmark = pytest.mark.xdist_group("real-sglang")  # with the shared servers (conftest.shared_sglang)


def test_every_sample_is_the_real_servers_own_answer_to_its_ids(fleet, tmp_path, shared_sglang):
    # Given the real server with a random model, and a worker bound to it
    server = shared_sglang("random")
    fleet.worker("w1", [server.url])

    # When a run of 12 prompts is enqueued at temperature 0 (random weights stop only at the budget)
    n = 12
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", "24", "--thinking", "off",
                   "--disable-rule", "truncated")

    # Then every prompt is stored, and each sample is exactly the prompt's ids then the server's own
    # answer to them, asked again directly
    assert fleet.wait_finished(timeout=300) == {"done": n}
    rows = fleet.rows()
    assert len(rows) == n
    for row in rows:
        prompt = row["input_ids"][:row["prompt_len"]]
        own = server.generate(prompt, max_new_tokens=24, temperature=0)
        assert row["input_ids"][row["prompt_len"]:] == own["output_ids"], row["id"]
        assert row["finish_reason"] == "length" and row["output_len"] == 24


def _plain_template_tokenizer(folder):
    """The bundled tokenizer with a template whose generation prompt opens no reasoning."""
    shutil.copytree(bundled_tokenizer_dir(), folder)
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text(template.replace("'<｜Assistant｜><think>'", "'<｜Assistant｜>'"))
    return folder


def test_a_reasoning_trace_through_the_real_engine_is_verified_stored_and_exported(fleet, tmp_path, tokenizer,
                                                                                   shared_sglang):
    # Given the real server with the trace model (after <think> it reasons, closes, answers and stops)
    server = shared_sglang("trace")
    fleet.worker("w1", [server.url])

    # When prompts are enqueued with the bundled reasoning template (it appends <think>)
    n = 8
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))), "--tokenizer", "bundled",
                   "--max-new-tokens", "64")

    # Then each is stored as the model answered it, with its think-end where the trace put it
    assert fleet.wait_finished(timeout=300) == {"done": n}
    trace, rows = expected_trace(tokenizer, thinking=True), fleet.rows()
    for row in rows:
        assert row["input_ids"][row["prompt_len"] - 1] == 128821  # the template's <think>
        assert row["input_ids"][row["prompt_len"]:] == trace
        assert row["think_end_index"] == row["prompt_len"] + trace.index(THINK_END)
        assert row["finish_reason"] == "stop"
    # and the export a drafter trainer reads holds the same ids, masked to exactly the generated tokens
    fleet.producer("export", str(tmp_path / "specforge"), "--format", "specforge")
    exported = [json.loads(line) for line in (tmp_path / "specforge" / "specforge.jsonl").read_text().splitlines()]
    stored = {row["id"]: row for row in rows}
    assert sorted(r["id"] for r in exported) == sorted(stored)
    for record in exported:
        row = stored[record["id"]]
        assert record["input_ids"] == row["input_ids"]
        assert record["loss_mask"] == [0] * row["prompt_len"] + [1] * row["output_len"]


def test_a_template_without_thinking_through_the_real_engine(fleet, tmp_path, tokenizer, shared_sglang):
    # Given the trace model (after the assistant's tag alone, it answers and stops: no reasoning)
    server = shared_sglang("trace")
    fleet.worker("w1", [server.url])
    plain = _plain_template_tokenizer(tmp_path / "plain-tokenizer")
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(6))

    # When a run with that template is enqueued without thinking, and another expecting the model to think
    fleet.producer("enqueue", str(prompts), "--tokenizer", str(plain), "--thinking", "off", "--run", "plain")
    fleet.producer("enqueue", str(prompts), "--tokenizer", str(plain), "--thinking", "output", "--run", "thinks")

    # Then the first stores each answer as the model gave it, with no think-end
    assert fleet.wait_finished("plain", timeout=300) == {"done": 6}
    for row in fleet.rows("plain"):
        assert row["input_ids"][row["prompt_len"] - 1] == ASSISTANT
        assert row["input_ids"][row["prompt_len"]:] == expected_trace(tokenizer, thinking=False)
        assert row["think_end_index"] is None
    # and the second dead-letters every prompt: the model never opened its reasoning
    assert fleet.wait_finished("thinks", timeout=300) == {"dead": 6}
    assert {d["reason"] for d in fleet.dead_letters("thinks")} == {"missing_think_start"}


def test_lines_own_sampling_and_logprobs_through_the_real_engine(fleet, tmp_path, shared_sglang):
    # Given the real server with a random model (it stops only at the budget), a worker bound to it, and
    # four prompts: two plain, one with a budget, top_k and seed of its own, one sampled hotter with min_p
    server = shared_sglang("random")
    fleet.worker("w1", [server.url])
    records = [{"id": "plain-0", "prompt": "What is 2 + 2?"}, {"id": "plain-1", "prompt": "Name a colour."},
               {"id": "short", "prompt": "Say yes.", "sampling": {"max_new_tokens": 8, "top_k": 1, "seed": 5}},
               {"id": "hot", "prompt": "Pick a number.", "sampling": {"temperature": 0.7, "min_p": 0.05}}]

    # When they are enqueued greedy with a budget of 16 and the top 3 log-probabilities of each token
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", "bundled",
                   "--temperature", "0", "--max-new-tokens", "16", "--thinking", "off", "--disable-rule", "truncated",
                   "--logprobs", "3")

    # Then every prompt is stored with the budget its line gave, or the run's
    assert fleet.wait_finished(timeout=300) == {"done": 4}
    rows = {row["id"]: row for row in fleet.rows()}
    assert {pid: (row["output_len"], row["max_new_tokens"]) for pid, row in rows.items()} == \
        {"plain-0": (16, 16), "plain-1": (16, 16), "short": (8, 8), "hot": (16, 16)}
    assert (rows["short"]["top_k"], rows["hot"]["min_p"] > 0.04, rows["hot"]["temperature"] > 0.6) == (1, True, True)
    # And each row holds the real server's log-probabilities of its tokens: one a token, 3 candidates a
    # token, the greedy token the most likely, as the server gives them when asked directly
    for pid, row in rows.items():
        n, output = row["output_len"], row["input_ids"][row["prompt_len"]:]
        assert len(row["logprobs"]) == n and len(row["top_logprob_ids"]) == len(row["top_logprobs"]) == 3 * n
        if pid.startswith("plain"):
            assert row["top_logprob_ids"][0::3] == output
            assert row["logprobs"] == pytest.approx(row["top_logprobs"][0::3], abs=1e-3)
            body = {"input_ids": row["input_ids"][:row["prompt_len"]], "return_logprob": True, "top_logprobs_num": 3,
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
            own = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
            assert own["output_ids"] == output
            assert row["logprobs"] == pytest.approx([e[0] for e in own["meta_info"]["output_token_logprobs"]], abs=1e-3)


def test_samples_of_a_prompt_are_each_the_real_servers_answer_and_it_takes_their_seeds(fleet, tmp_path, shared_sglang):
    # Given the real server with a random model, and a worker bound to it
    server = shared_sglang("random")
    fleet.worker("w1", [server.url])

    # When 3 prompts are enqueued with 2 samples each (every request carries its sampling_seed), at
    # temperature 0 so that each answer can be asked again
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(3))), "--tokenizer", "bundled",
                   "--samples", "2", "--temperature", "0", "--max-new-tokens", "16", "--thinking", "off",
                   "--disable-rule", "truncated")

    # Then the server takes the seeds (no request refused), every (id, sample) is stored once, and each
    # is the server's own answer to its ids asked again with its seed
    assert fleet.wait_finished(timeout=300) == {"done": 6}
    rows = fleet.rows()
    assert sorted((r["id"], r["sample"]) for r in rows) == [(f"p-{i:04d}", n) for i in range(3) for n in range(2)]
    for row in rows:
        prompt = row["input_ids"][:row["prompt_len"]]
        own = server.generate(prompt, max_new_tokens=16, temperature=0, sampling_seed=row["seed"])
        assert row["input_ids"][row["prompt_len"]:] == own["output_ids"], (row["id"], row["sample"])


def test_rejection_sampling_through_the_real_engine_keeps_sampling_only_what_the_math_verifier_fails(
        fleet, tmp_path, shared_sglang):
    # Given the trace model (its answer after the reasoning: "So the total is \boxed{12}."), and two
    # prompts whose lines give the answer the math verifier compares with: 12, and 13
    server = shared_sglang("trace")
    fleet.worker("w1", [server.url])
    records = [{"id": "twelve", "prompt": "How many apples in all?", "answer": "12"},
               {"id": "thirteen", "prompt": "How many pears in all?", "answer": "13"}]

    # When they are enqueued for at most 3 samples each, until one passes
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)), "--tokenizer", "bundled",
                   "--max-new-tokens", "64", "--verify", "math", "--samples", "3", "--until-verified", "1")

    # Then the first prompt stops at its first sample, which passed, and the second is sampled 3 times,
    # each failing, every sample the real engine's answer with the seed it was asked with
    assert fleet.wait_finished(timeout=300) == {"done": 4}
    rows = sorted(fleet.rows(), key=lambda r: (r["id"], r["sample"]))
    assert [(r["id"], r["sample"], r["verified"], r["verdict"]) for r in rows] == [
        ("thirteen", 0, False, "fail"), ("thirteen", 1, False, "fail"), ("thirteen", 2, False, "fail"),
        ("twelve", 0, True, "pass")]
    assert len({r["seed"] for r in rows}) == 4
    # and the export of what passed holds that one sample
    fleet.producer("export", str(tmp_path / "dest"), "--verified-only")
    manifest = json.loads((tmp_path / "dest" / "manifest.json").read_text())
    assert manifest["rows"] == 1 and manifest["left_out"] == {"verdict:fail": 3}
