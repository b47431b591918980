"""A line's own `sampling`: checked at enqueue as SGLang checks it (the line's number and reason on a
bad value, the other lines published), recorded once per line before its prompt is queued, and
merged over the run's by the worker into what is sent (contract/run/line_sampling.py)."""
from __future__ import annotations

import hashlib
import io
import json
import math

import pytest
from typer.testing import CliRunner

from contract.ledger.ledger import Ledger
from contract.run.line_fields import LineFields
from contract.run.line_sampling import BadSampling, check_line_sampling, merged
from contract.run.samples import sample_seed
from contract.run.spec import RunSpec, load_spec
from producer.cli import app
from producer.prompts import BadLine, Prompt, mentions_line_fields, read_prompts
from workers.intake.generation import line_record, request_sampling
from workers.intake.request_loop import fit_context

RUN_SAMPLING = {"max_new_tokens": 64, "temperature": 0.6, "top_p": 0.95, "skip_special_tokens": False}

GOOD = {
    "temperature": [0, 0.0, 1, 1.7, 1e-7],
    "top_p": [1, 0.5, 1e-9],
    "top_k": [-1, 1, 40],
    "min_p": [0, 0.0, 0.05, 1],
    "max_new_tokens": [1, 4096],
    "seed": [0, 42, 2**31 - 1],
}
# (the sampling object, a part of the reason the line is reported with)
BAD = [
    ({"temperature": -0.1}, "sampling.temperature must be a non-negative finite number, got -0.1"),
    ({"temperature": "hot"}, "sampling.temperature must be a number, not a string"),
    ({"temperature": True}, "sampling.temperature must be a number, not a boolean (true)"),
    ({"temperature": None}, "sampling.temperature must be a number, not null"),
    ({"top_p": 0}, "sampling.top_p must be in (0, 1], got 0"),
    ({"top_p": 1.5}, "sampling.top_p must be in (0, 1], got 1.5"),
    ({"top_k": 0}, "sampling.top_k must be -1 (the whole vocabulary) or at least 1, got 0"),
    ({"top_k": -2}, "sampling.top_k must be -1 (the whole vocabulary) or at least 1, got -2"),
    ({"top_k": 4.0}, "sampling.top_k must be an integer, not a number (4.0)"),
    ({"min_p": -0.01}, "sampling.min_p must be in [0, 1], got -0.01"),
    ({"min_p": 2}, "sampling.min_p must be in [0, 1], got 2"),
    ({"max_new_tokens": 0}, "sampling.max_new_tokens must be at least 1"),
    ({"max_new_tokens": 3.0}, "sampling.max_new_tokens must be an integer, not a number (3.0)"),
    ({"max_new_tokens": 2**31}, "sampling.max_new_tokens must be at least 1 (and at most 2147483647)"),
    ({"seed": -1}, "sampling.seed must be in [0, 2^31), got -1"),
    ({"seed": 2**31}, "sampling.seed must be in [0, 2^31), got 2147483648"),
    ({"seed": "7"}, "sampling.seed must be an integer, not a string"),
    ({"max_tokens": 5}, "\"sampling\" has unknown key 'max_tokens' (allowed: temperature, top_p, top_k, min_p"),
    ({"temperature": 0.5, "stop": ["x"]}, "\"sampling\" has unknown key 'stop'"),
    ([0.5], '"sampling" must be an object, not an array'),
    ("greedy", '"sampling" must be an object, not a string'),
]


def line(sampling, pid="a") -> bytes:
    return json.dumps({"id": pid, "prompt": "What is 2+2?", "sampling": sampling}).encode()


@pytest.mark.parametrize("key", list(GOOD))
def test_each_key_takes_the_values_sglang_takes_and_keeps_them_as_given(key):
    for value in GOOD[key]:
        # Given a line whose sampling sets this key to a value SGLang accepts; when it is read
        [prompt] = read_prompts(io.BytesIO(line({key: value})))
        # Then it is a prompt carrying exactly that sampling
        assert isinstance(prompt, Prompt) and prompt.sampling == {key: value}, prompt


@pytest.mark.parametrize("sampling,reason", BAD, ids=[r for _, r in BAD])
def test_a_value_sglang_would_refuse_is_the_lines_own_error_with_its_number(sampling, reason):
    # Given a file whose second line's sampling holds a value SGLang would refuse, between good lines
    data = b"\n".join([line({"temperature": 0.2}, "a"), line(sampling, "b"), line(None, "c")]) + b"\n"

    # When it is read
    items = list(read_prompts(io.BytesIO(data)))

    # Then that line is a BadLine with its number and the key's reason; the others are prompts
    assert [type(i) for i in items] == [Prompt, BadLine, Prompt]
    assert items[1].line == 2 and reason in items[1].reason, items[1].reason
    assert items[0].sampling == {"temperature": 0.2} and items[2].sampling is None


def test_nan_and_infinity_are_refused_like_any_value_sglang_refuses():
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        raw = b'{"id": "n", "prompt": "x", "sampling": {"temperature": ' + literal + b"}}"
        [item] = read_prompts(io.BytesIO(raw))
        assert isinstance(item, BadLine) and "temperature must be a non-negative finite number" in item.reason
    with pytest.raises(BadSampling, match="top_p must be in"):
        check_line_sampling({"top_p": math.nan})


def test_an_empty_or_null_sampling_is_no_sampling_of_its_own():
    assert check_line_sampling(None) is None and check_line_sampling({}) is None
    [prompt] = read_prompts(io.BytesIO(line({})))
    assert prompt.sampling is None


def test_a_derived_id_is_unchanged_without_sampling_and_tells_two_samplings_apart():
    # Given the same prompt without an id: plain, and with two samplings
    plain = b'{"prompt": "What is 2+2?"}'
    cold = b'{"prompt": "What is 2+2?", "sampling": {"temperature": 0}}'
    hot = b'{"prompt": "What is 2+2?", "sampling": {"temperature": 1.2}}'
    ids = [next(read_prompts(io.BytesIO(raw))).id for raw in (plain, cold, hot)]
    # Then the plain line keeps the id it always had (its messages' digest); the others differ from it and
    # from each other
    assert ids[0] == "p-" + hashlib.sha256(
        json.dumps([{"role": "user", "content": "What is 2+2?"}], sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()[:20]
    assert len(set(ids)) == 3


def test_a_file_mentions_line_sampling_wherever_the_key_falls_even_across_a_read(tmp_path):
    path = tmp_path / "p.jsonl"
    without = b'{"id": "a", "prompt": "about \\"sampling\\" theory"}\n' * 50
    path.write_bytes(without)
    assert not mentions_line_fields(path, chunk=64)  # the word inside a prompt's text is escaped
    for offset in range(12):  # the key split at every place between two reads
        path.write_bytes(b" " * offset + b'{"id": "b", "prompt": "x", "sampling": {"top_k": 5}}\n')
        assert mentions_line_fields(path, chunk=16), offset


# ------------------------------------------------------------------------------------------- the merge
def spec(**over) -> RunSpec:
    fields = dict(name="r", tokenizer="t", tokenizer_fingerprint="f", template_fingerprint="g",
                  sampling=RUN_SAMPLING, thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3])
    return RunSpec(**{**fields, **over})


def test_a_line_without_its_own_sampling_is_sent_the_runs_exactly():
    assert request_sampling(spec(), "a", {}) == RUN_SAMPLING
    assert request_sampling(spec(line_fields=True), "a", {"fields": {"answer": "4"}}) == RUN_SAMPLING


def test_each_key_the_line_gives_replaces_the_runs_and_the_others_stay():
    # Given a line that sets temperature, top_k and a budget of its own
    own = {"temperature": 0.0, "top_k": 20, "max_new_tokens": 16}
    # When its request's sampling is built
    sent = request_sampling(spec(line_fields=True), "a", {"sampling": own})
    # Then those three are the line's, and top_p and the rest the run's
    assert sent == {**RUN_SAMPLING, "temperature": 0.0, "top_k": 20, "max_new_tokens": 16}


def test_a_lines_seed_goes_as_sampling_seed_and_one_per_sample_in_a_run_of_several():
    # Given a line asking for seed 7
    line_fields = {"sampling": {"seed": 7, "min_p": 0.1}}
    # Then in a run of one sample it is sent as SGLang's sampling_seed 7, never as "seed"
    one = request_sampling(spec(line_fields=True), "a", line_fields)
    assert one["sampling_seed"] == 7 and "seed" not in one and one["min_p"] == 0.1
    # And in a run of three samples, sample i gets 7 + i; a line without a seed its derived one
    many = spec(line_fields=True, samples=3)
    assert [request_sampling(many, f"a~{i}", line_fields)["sampling_seed"] for i in range(3)] == [7, 8, 9]
    assert request_sampling(many, "b~2", {})["sampling_seed"] == sample_seed("r", "b", 2)


def test_a_requeues_budget_overrides_the_lines_and_merged_never_changes_the_runs_dict():
    run = dict(RUN_SAMPLING)
    sent = request_sampling(spec(sampling=run, line_fields=True), "a", {"sampling": {"max_new_tokens": 16}}, 99)
    assert sent["max_new_tokens"] == 99 and run == RUN_SAMPLING
    assert merged(run, {"seed": 3}) == RUN_SAMPLING


class _Runtime:
    def __init__(self, redis):
        self.redis = redis


def test_a_worker_reads_a_lines_record_only_in_a_run_that_has_them(client):
    # Given a run's line records: one of prompt "q", one of conversation "c"
    LineFields(client, "r").add_new({"q": {"sampling": {"top_k": 3}}, "c": {"sampling": {"min_p": 0.2}}})
    # Then a run whose spec says its lines carry none reads nothing (not even Redis: there is none here)
    assert line_record(_Runtime(None), spec(), "q") == {}
    rt = _Runtime(client)
    # And one that does finds a prompt's record by its id, a sample's by its prompt's, a turn's by its conversation's
    assert line_record(rt, spec(line_fields=True), "q") == {"sampling": {"top_k": 3}}
    assert line_record(rt, spec(line_fields=True, samples=4), "q~3") == {"sampling": {"top_k": 3}}
    assert line_record(rt, spec(line_fields=True, turns="all"), "c#2") == {"sampling": {"min_p": 0.2}}
    assert line_record(rt, spec(line_fields=True), "other") == {}


# ------------------------------------------------------------------------------------------- at enqueue
def enqueue(server: str, *args: str):
    return CliRunner().invoke(app, ["enqueue", *args], env={"REDIS_URL": server, "COLUMNS": "200"})


def test_enqueue_records_each_lines_sampling_and_reports_a_bad_one_by_number(server, client, tmp_path):
    # Given a file: a line with its own sampling, a plain one, one with a bad top_p, a repeat of the
    # plain one's id carrying a sampling of its own, and one with a seed
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([
        '{"id": "own", "prompt": "a", "sampling": {"temperature": 0, "max_new_tokens": 16}}',
        '{"id": "plain", "prompt": "b"}',
        '{"id": "bad", "prompt": "c", "sampling": {"top_p": 0}}',
        '{"id": "plain", "prompt": "b", "sampling": {"top_k": 9}}',
        '{"id": "seeded", "prompt": "d", "sampling": {"seed": 11}}',
    ]) + "\n")

    # When it is enqueued
    result = enqueue(server, str(path), "--run", "lines")

    # Then the bad line is reported with its number and reason, and the exit status is 1
    assert result.exit_code == 1, result.output
    assert "line 3: sampling.top_p must be in (0, 1], got 0" in result.output
    # And the run's spec says its lines carry records; the others are queued
    assert load_spec(client, "lines").line_fields
    states = [e.state for e in Ledger(client, "lines").entries(["own", "plain", "bad", "seeded"])]
    assert states == ["queued", "queued", None, "queued"]
    lines = LineFields(client, "lines")
    # And each line with a sampling of its own has it recorded under its id; the plain one none, its
    # repeat's sampling not taken for it (the first line of an id is the one queued)
    assert lines.get("own") == {"sampling": {"temperature": 0, "max_new_tokens": 16}}
    assert lines.get("seeded") == {"sampling": {"seed": 11}}
    assert lines.get("plain") == {} and lines.get("bad") == {}


def test_a_run_started_without_line_sampling_rejects_a_later_line_that_has_one(server, client, tmp_path):
    # Given a run started from a file without any line sampling (its workers read no line records)
    first, later = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"id": "a", "prompt": "x"}\n')
    later.write_text('{"id": "b", "prompt": "y"}\n{"id": "c", "prompt": "z", "sampling": {"temperature": 1}}\n')
    assert enqueue(server, str(first), "--run", "plain").exit_code == 0
    assert not load_spec(client, "plain").line_fields

    # When a later file with a line of its own sampling is enqueued into it
    result = enqueue(server, str(later), "--run", "plain")

    # Then that line is rejected by number, saying why and what to do; the other is queued
    assert result.exit_code == 1
    assert "line 2: line has its own \"sampling\", but run 'plain' was started from a file without any, so its " \
           "workers do not read one: enqueue such lines under a new run (--run NEW_NAME) (id c)" in result.output
    assert [e.state for e in Ledger(client, "plain").entries(["b", "c"])] == ["queued", None]
    assert LineFields(client, "plain").get("c") == {}
    assert not load_spec(client, "plain").line_fields


def test_a_conversations_line_sampling_is_recorded_under_the_conversation_for_all_its_turns(server, client, tmp_path):
    # Given a conversation line with a sampling of its own, enqueued to regenerate every turn
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "conv", "sampling": {"top_k": 7}, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}) + "\n")
    assert enqueue(server, str(path), "--run", "talk", "--turns", "all").exit_code == 0
    # Then its record is under the conversation's id, where a worker looks for each turn's
    assert LineFields(client, "talk").get("conv") == {"sampling": {"top_k": 7}}
    spec_ = load_spec(client, "talk")
    assert line_record(_Runtime(client), spec_, "conv#1") == {"sampling": {"top_k": 7}}
    assert request_sampling(spec_, "conv#1", line_record(_Runtime(client), spec_, "conv#1"))["top_k"] == 7


def test_a_lines_budget_is_the_one_cut_to_the_servers_context():
    # Given a line whose own budget is larger than the run's, for a server of a 4,096-token context
    line_fields = {"sampling": {"max_new_tokens": 4000}}
    sent = request_sampling(spec(line_fields=True), "a", line_fields)
    # When it is fitted to a prompt of 1,000 tokens there, then the line's budget is what is cut
    assert fit_context(sent, 1000, 4096)["max_new_tokens"] == 4096 - 1000 - 2
    # And one that fits is sent as the line gave it
    assert fit_context(request_sampling(spec(line_fields=True), "a", {"sampling": {"max_new_tokens": 20}}),
                       1000, 4096)["max_new_tokens"] == 20
