"""`--logprobs K`: an answer's log-probabilities read as SGLang 0.5.23 gives them, checked token for token
against `output_ids` (a mismatch is the server's bad answer), stored in three compact columns and read
back as (output_len, K) arrays (contract/run/logprobs.py)."""
from __future__ import annotations

import copy
import math
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from contract.run.logprobs import BadLogprobs, from_meta, request_fields, unflatten
from contract.storage.schema import Sample, arrow_schema, samples_to_table
from contract.run.spec import load_spec
from producer.cli import app
from sglang_standin.logprobs import LogprobAsk, logprob_meta
from workers.servers.answers import BadOutput, answer_cap, read_logprobs

# meta_info of SGLang 0.5.23 (CPU engine, random checkpoint) for max_new_tokens 3, top_logprobs_num 2,
# logprob_start_len -1, as measured (the other keys left out)
OUTPUT_IDS = [86462, 83796, 83796]
REAL_META = {
    "input_token_logprobs": [],
    "output_token_logprobs": [[-10.881352424621582, 86462, None], [-10.825048446655273, 83796, None],
                              [-10.077046394348145, 83796, None]],
    "output_token_logprobs_length": 3,
    "input_top_logprobs": [],
    "output_top_logprobs": [[[-10.200549125671387, 111, None], [-10.79206657409668, 93880, None]],
                            [[-10.177726745605469, 86462, None], [-10.780405044555664, 123343, None]],
                            [[-10.077046394348145, 83796, None], [-10.696466445922852, 125550, None]]],
    "completion_tokens": 3,
}


def test_the_request_asks_for_output_tokens_only_and_nothing_without_k():
    assert request_fields(3) == {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": -1}
    assert request_fields(None) == request_fields(0) == {}


def test_a_real_answer_is_packed_one_logprob_a_token_and_k_candidates_a_token_row_major():
    # Given the real server's answer for K = 2; when it is read
    scores = from_meta(REAL_META, OUTPUT_IDS, 2)
    # Then there is one log-probability per output token, the chosen token's
    assert scores.chosen == [-10.881352424621582, -10.825048446655273, -10.077046394348145]
    # And K candidates per token, flattened: token i's are entries [i*K, (i+1)*K), most likely first
    assert scores.top_ids == [111, 93880, 86462, 123343, 83796, 125550]
    assert scores.top[2:4] == [-10.177726745605469, -10.780405044555664]


BROKEN = {
    "a chosen id other than the output id": (lambda m: m["output_token_logprobs"][1].__setitem__(1, 5),
                                             "output_token_logprobs[1] names token 5, output_ids[1] is 83796"),
    "one entry short": (lambda m: m["output_token_logprobs"].pop(),
                        "2 output_token_logprobs and 3 output_top_logprobs for 3 output ids"),
    "K - 1 candidates at a token": (lambda m: m["output_top_logprobs"][2].pop(), "output_top_logprobs[2] has 1 entries, not 2"),
    "no lists at all": (lambda m: m.pop("output_top_logprobs"), "the answer has no output_token_logprobs"),
    "a null top list": (lambda m: m["output_top_logprobs"].__setitem__(0, None), "output_top_logprobs[0] has NoneType"),
    "a text logprob": (lambda m: m["output_top_logprobs"][0][1].__setitem__(0, "x"), "logprob x is not a number"),
    "a NaN logprob": (lambda m: m["output_token_logprobs"][0].__setitem__(0, math.nan), "logprob nan is not a number"),
    "a boolean token id": (lambda m: m["output_top_logprobs"][0][0].__setitem__(1, True), "token id True is not a token id"),
    "a bare number entry": (lambda m: m["output_token_logprobs"].__setitem__(0, -1.0), "is not a [logprob, token_id"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_an_answer_whose_logprobs_do_not_fit_its_tokens_is_a_bad_answer(case):
    # Given the real answer, broken one way
    meta = copy.deepcopy(REAL_META)
    breaks, message = BROKEN[case]
    breaks(meta)
    # When the worker reads it, then it is a BadOutput (retried, then bad_output) that says where
    with pytest.raises(BadOutput, match="log-probabilities: ") as raised:
        read_logprobs(meta, OUTPUT_IDS, 2)
    assert message in str(raised.value) and raised.value.excerpt["output_len"] == 3
    with pytest.raises(BadLogprobs):
        from_meta(meta, OUTPUT_IDS, 2)


def test_a_null_logprob_is_minus_infinity_and_the_lists_leave_meta_info():
    meta = copy.deepcopy(REAL_META)
    meta["output_top_logprobs"][0][1][0] = None  # JSON's null for a logprob that was not finite
    scores = read_logprobs(meta, OUTPUT_IDS, 2)
    assert scores.top[1] == float("-inf")
    assert "output_top_logprobs" not in meta and "output_token_logprobs" not in meta
    assert meta["completion_tokens"] == 3  # what a sample reads stays


def test_no_token_is_no_logprobs_though_sglang_sends_one_top_list_for_a_budget_of_0():
    meta = {"output_token_logprobs": [], "output_top_logprobs": [[[-1.0, 5, None], [-2.0, 6, None]]]}
    assert from_meta(meta, [], 2).chosen == []


def test_the_standins_logprobs_fit_its_tokens_as_the_real_servers_do():
    # Given the stand-in's logprob keys for a prompt, an answer of 4 tokens, and of none
    ask = LogprobAsk(top=3, start=-1)
    meta = logprob_meta(ask, [100, 101, 102], [7, 8, 8, 1], 129280)
    empty = logprob_meta(ask, [100, 101, 102], [], 129280)
    # Then they have the real server's keys, in its order, and read as the fleet reads the real ones
    assert list(meta) == ["input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length",
                          "input_top_logprobs", "output_top_logprobs"]
    scores = from_meta(meta, [7, 8, 8, 1], 3)
    assert len(scores.chosen) == 4 and len(scores.top_ids) == 12 and scores.top_ids[0::3] == [7, 8, 8, 1]
    assert all(len(set(scores.top_ids[i:i + 3])) == 3 for i in range(0, 12, 3))
    assert len(empty["output_top_logprobs"]) == 1 and empty["output_token_logprobs"] == []
    # And without top_logprobs_num there are no top lists
    assert "output_top_logprobs" not in logprob_meta(LogprobAsk(top=0, start=-1), [1], [2], 10)


def test_an_answer_with_logprobs_may_be_larger_by_their_entries():
    assert answer_cap(1000) < answer_cap(1000, logprobs=1) < answer_cap(1000, logprobs=20)
    assert answer_cap(1000, logprobs=20) >= 1000 * (256 + 21 * 40)
    assert answer_cap(1000, override=5, logprobs=20) == 5


def _sample(**over) -> Sample:
    now = datetime.now(timezone.utc)
    fields = dict(id="a", input_ids=[1, 2, 3, 4, 5], prompt_len=2, output_len=3, finish_reason="stop", stop_token=5,
                  think_end_index=None, run="r", server="s", model=None, max_new_tokens=8, temperature=0.6,
                  top_p=0.95, attempts=1, worker="w", tokenizer_fingerprint="t", template_fingerprint="g",
                  e2e_latency=0.1, started_at=now, finished_at=now)
    return Sample(**{**fields, **over})


def test_a_shard_keeps_the_logprobs_compactly_and_reads_back_as_n_by_k(tmp_path):
    # Given a row with K = 2 log-probabilities, and one of a run without them
    scores = from_meta(REAL_META, OUTPUT_IDS, 2)
    with_scores = _sample(input_ids=[9, 9, *OUTPUT_IDS], top_k=20, min_p=0.05, logprobs=scores.chosen,
                          top_logprob_ids=scores.top_ids, top_logprobs=scores.top)
    plain = _sample(id="b")
    # When both are written to Parquet and read back
    path = tmp_path / "s.parquet"
    pq.write_table(samples_to_table([with_scores, plain]), path)
    table = pq.read_table(path)
    # Then the columns are float32 and int32 lists, together, null for the plain row
    names = table.schema.names
    assert names[names.index("top_k"):names.index("top_logprobs") + 1] == ["top_k", "min_p", "logprobs", "top_logprob_ids",
                                                                          "top_logprobs"]
    assert str(table.schema.field("top_logprobs").type) == "list<element: float>"
    assert str(table.schema.field("top_logprob_ids").type) == "list<element: int32>"
    rows = table.to_pylist()
    assert rows[1]["logprobs"] is None and unflatten(rows[1]) is None and rows[1]["top_k"] is None
    # And the first reads back as (output_len,) and (output_len, K) arrays, float32-rounded
    chosen, ids, top = unflatten(rows[0])
    assert chosen.shape == (3,) and ids.shape == top.shape == (3, 2)
    assert ids[1].tolist() == [86462, 123343] and abs(top[2, 0] - -10.077046) < 1e-5
    assert rows[0]["top_k"] == 20 and abs(rows[0]["min_p"] - 0.05) < 1e-7


def test_logprobs_take_1_to_20_into_the_runs_spec_and_0_is_none(server, client, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n')

    def enqueue(*args: str):
        return CliRunner().invoke(app, ["enqueue", str(path), *args], env={"REDIS_URL": server, "COLUMNS": "200"})

    refused = enqueue("--logprobs", "21", "--run", "too-many")
    assert refused.exit_code == 2 and "Invalid value for '--logprobs'" in refused.output
    assert enqueue("--logprobs", "3", "--run", "three").exit_code == 0
    assert enqueue("--logprobs", "0", "--run", "none").exit_code == 0
    assert load_spec(client, "three").logprobs == 3 and load_spec(client, "none").logprobs is None
    # And a run of K log-probabilities is another run than one without (its rows differ)
    again = enqueue("--run", "three")
    assert again.exit_code == 2 and "logprobs: 3 -> None" in again.output.replace("\n", "")
    assert arrow_schema().field("logprobs").type.value_type.bit_width == 32
