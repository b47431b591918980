"""The report's figures, computed from small Parquet shards built here (no processes)."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from contract.ledger.codec import ids_to_b64
from contract.ledger.deadletters import DeadLetter
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec
from producer.report.figures import figures, repeated_hashes
from producer.report.letters import LetterTally
from producer.report.read import shard_batches
from producer.report.samples import SampleTally
from producer.report.tally import Counts, FoldingGrid, LogHistogram, Picks

T0 = 1_700_000_000.0
THINK_START, THINK_END, EOS = 128821, 128822, 1
SPEC = RunSpec(name="t", tokenizer="bundled", tokenizer_fingerprint="tok-fp", template_fingerprint="tpl-fp",
               sampling={"max_new_tokens": 100, "temperature": 0.6, "top_p": 0.95}, thinking="prompt",
               think_start_id=THINK_START, think_end_id=THINK_END, stop_ids=[EOS], created_at=T0)


def sample(pid: str, prompt: list[int], output: list[int], finish: str = "stop", at: float = 1.0,
           server: str = "http://s1", latency: float = 0.5, max_new_tokens: int = 100,
           cached: int | None = None) -> Sample:
    end = output.index(THINK_END) if THINK_END in output else None
    return Sample(id=pid, input_ids=prompt + output, prompt_len=len(prompt), output_len=len(output),
                  finish_reason=finish, stop_token=EOS if finish == "stop" else None,
                  think_end_index=None if end is None else len(prompt) + end, run="t", server=server,
                  model="m", max_new_tokens=max_new_tokens, temperature=0.6, top_p=0.95, attempts=1, worker="w1",
                  tokenizer_fingerprint="tok-fp", template_fingerprint="tpl-fp", e2e_latency=latency,
                  started_at=datetime.fromtimestamp(T0 + at - latency, timezone.utc),
                  finished_at=datetime.fromtimestamp(T0 + at, timezone.utc), cached_tokens=cached)


PROMPT = [100, 101, THINK_START]
GOOD = [20, 21, THINK_END, 30, 31, EOS]                   # reasoning 2, answer 3 (stop included)
SAMPLES = [  # cached: prompt tokens found in the server's prefix cache (c's server did not say)
    sample("a", PROMPT, GOOD, at=0.5, cached=0),
    sample("b", [100, 102, 103, THINK_START], [20, THINK_END, EOS], at=1.5, server="http://s2", latency=2.0,
           cached=2),
    sample("c", [100, 104, THINK_START], list(range(200, 300)), finish="length", at=200.0, latency=9.0),
    sample("d", [100, 105, THINK_START], GOOD, at=3.0, cached=2),   # d and e: the same output ids as a
    sample("e", [100, 106, 107, 108, THINK_START], GOOD, at=3.0, server="http://s2", cached=3),
]
DUPLICATE = sample("a", PROMPT, GOOD, at=0.5, cached=0)   # a redelivered prompt, stored twice


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    folder = tmp_path / "t"
    folder.mkdir()
    pq.write_table(samples_to_table(SAMPLES[:3]), folder / "part-1.parquet")
    pq.write_table(samples_to_table(SAMPLES[3:] + [DUPLICATE]), folder / "part-2.parquet")
    pq.write_table(samples_to_table([DUPLICATE]), folder / ".tmp-part-3.parquet")  # not a shard
    return tmp_path


def letter(pid: str, reason: str, dead_at: float, excerpt: dict | None = None) -> DeadLetter:
    return DeadLetter(id=pid, run="t", reason=reason, message="m", attempts=1, servers=["http://s1"], worker="w1",
                      prompt_b64=ids_to_b64(PROMPT), prompt_tokens=3, sampling=SPEC.sampling, excerpt=excerpt or {},
                      first_attempt_at=T0 + dead_at - 1, dead_at=T0 + dead_at)


LETTERS = [
    letter("x1", "truncated", 10.0, {"output_len": 100, "finish_reason": {"type": "length", "length": 100},
                                     "think_end": [], "first_output_ids": [1], "last_output_ids": [2]}),
    letter("x2", "missing_think_end", 20.0, {"output_len": 5, "finish_reason": {"type": "stop"}, "think_end": []}),
    letter("x0", "truncated", 30.0, {"output_len": 100, "finish_reason": {"type": "length"}, "think_end": [40]}),
    letter("x3", "server_error", 400.0),
]


def tally(folder: Path, batch_rows: int = 2) -> tuple[SampleTally, LetterTally]:
    samples, letters = SampleTally(SPEC), LetterTally(SPEC)
    for batch in shard_batches(str(folder), "t", batch_rows=batch_rows):
        samples.add(batch)
    for item in LETTERS:
        letters.add(item)
    return samples, letters


def test_every_stored_row_is_counted_once_and_a_prompt_stored_twice_once_as_a_sample(shards):
    data = figures(*tally(shards), SPEC)
    assert data["samples"] == {"rows": 6, "unique_ids": 5, "duplicate_rows": 1}


def test_lengths_are_exact_token_counts_with_reasoning_before_think_end_and_the_answer_after(shards):
    data = figures(*tally(shards), SPEC)
    outputs = [6, 3, 100, 6, 6, 6]
    lengths = data["lengths"]
    assert (lengths["output"]["n"], lengths["output"]["total"], lengths["output"]["max"]) == (6, sum(outputs), 100)
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert lengths["output"][key] == int(np.percentile(outputs, 100 * q, method="inverted_cdf"))
    # c never closed its reasoning: it has no reasoning or answer length
    assert lengths["reasoning"]["n"] == 5 and lengths["reasoning"]["total"] == 2 + 1 + 2 + 2 + 2
    assert lengths["answer"]["n"] == 5 and lengths["answer"]["total"] == 3 + 1 + 3 + 3 + 3
    assert lengths["prompt"]["total"] == 3 + 4 + 3 + 3 + 5 + 3
    hist = lengths["output"]["histogram"]
    assert sum(hist["counts"]) == 6 and hist["edges"][-1] + hist["width"] > data["budget"] == 100


def test_finish_reasons_and_think_closure_cover_stored_and_dead_lettered_generations(shards):
    data = figures(*tally(shards), SPEC)
    assert data["finish"] == {"stored": {"length": 1, "stop": 5},
                              "dead": {"length": 2, "stop": 1, "no generation": 1}}
    assert data["closure"] == {"stored": {"one": 5, "none": 1},
                               "dead": {"none": 2, "one": 1, "no generation": 1}}


def test_empty_repeated_and_stopless_answers_are_counted(shards):
    samples, letters = tally(shards)
    data = figures(samples, letters, SPEC)
    assert data["quality"]["counts"] == {"empty_answer": 1, "repeated": 3, "no_stop_token": 1, "unclosed": 1,
                                         "truncated": 1}
    assert data["quality"]["shares"]["repeated"] == round(3 / 6, 6)
    # and what the rules caught instead: 2 truncated dead letters, 3 generations without a stop, 1 unclosed
    assert data["quality"]["dead_lettered"] == {"empty_answer": 0, "repeated": 0, "no_stop_token": 2,
                                                "unclosed": 1, "truncated": 2}
    assert len(repeated_hashes(samples)) == 1


def test_examples_are_the_shortest_longest_and_flagged_ids(shards):
    examples = figures(*tally(shards), SPEC)["examples"]
    assert examples["shortest"] == ["b", "a", "d"]  # ties at 6 tokens: the smallest ids, a (stored twice) once
    assert examples["longest"][0] == "c"
    assert examples["truncated"] == ["c"] and examples["unclosed"] == ["c"] and examples["empty_answer"] == ["b"]
    assert examples["dead:truncated"] == ["x0", "x1"] and examples["dead:server_error"] == ["x3"]


def test_timeline_sums_to_the_samples_tokens_and_dead_letters_on_one_time_axis(shards):
    data = figures(*tally(shards), SPEC)
    timeline = data["timeline"]
    assert sum(timeline["samples"]) == 6 and sum(timeline["output_tokens"]) == 127
    assert {r: sum(v) for r, v in timeline["dead_by_reason"].items()} == {
        "missing_think_end": 1, "server_error": 1, "truncated": 2}
    # one width for all series, wide enough for the last event (400 s) in at most 128 buckets
    assert timeline["width_s"] * 128 > 400
    assert all(len(v) <= 128 for v in [timeline["samples"], *timeline["dead_by_reason"].values()])


def test_servers_get_their_samples_tokens_and_latency(shards):
    servers = {s["server"]: s for s in figures(*tally(shards), SPEC)["servers"]}
    assert {k: (s["samples"], s["output_tokens"]) for k, s in servers.items()} == {
        "http://s1": (4, 6 + 100 + 6 + 6), "http://s2": (2, 3 + 6)}
    assert servers["http://s1"]["latency_s"]["max"] == 9.0 and servers["http://s2"]["latency_s"]["n"] == 2


def test_prefix_cache_hits_are_cached_over_prompt_tokens_of_the_rows_that_say(shards):
    data = figures(*tally(shards), SPEC)
    # s1: a, c, d and a again, c without a figure; s2: b and e
    servers = {s["server"]: s["cache"] for s in data["servers"]}
    assert servers["http://s1"] == {"prompt_tokens": 12, "known_prompt_tokens": 9, "cached_tokens": 2,
                                    "share": round(2 / 9, 4)}
    assert servers["http://s2"] == {"prompt_tokens": 9, "known_prompt_tokens": 9, "cached_tokens": 5,
                                    "share": round(5 / 9, 4)}
    assert data["cache"] == {"prompt_tokens": 21, "known_prompt_tokens": 18, "cached_tokens": 7,
                             "share": round(7 / 18, 4), "rows_known": 5, "rows": 6}
    # and over time, on the timeline's axis, the same sums
    timeline = data["timeline"]
    assert sum(timeline["cached_tokens"]) == 7 and sum(timeline["known_prompt_tokens"]) == 18
    assert len(timeline["cached_tokens"]) == len(timeline["samples"])


def test_a_shard_older_than_the_cached_tokens_column_reads_as_unknown_hits(tmp_path):
    # Given a run whose first shard was written before the column existed, and a newer one
    folder = tmp_path / "t"
    folder.mkdir()
    old = samples_to_table(SAMPLES[:2])
    pq.write_table(old.drop_columns(["cached_tokens"]), folder / "part-1.parquet")
    pq.write_table(samples_to_table(SAMPLES[3:4]), folder / "part-2.parquet")
    # When its figures are computed
    data = figures(*tally(tmp_path), SPEC)
    # Then the old rows count as samples and prompt tokens, but not in any share
    assert data["samples"]["rows"] == 3
    assert data["cache"] == {"prompt_tokens": 10, "known_prompt_tokens": 3, "cached_tokens": 2,
                             "share": round(2 / 3, 4), "rows_known": 1, "rows": 3}
    assert {s["server"]: s["cache"]["share"] for s in data["servers"]} == {"http://s1": round(2 / 3, 4),
                                                                            "http://s2": None}


def test_a_run_whose_servers_never_said_has_no_share_and_charts_say_so(tmp_path):
    from producer.report.charts import CHARTS, NO_CACHE_FIGURES, draw

    folder = tmp_path / "t"
    folder.mkdir()
    pq.write_table(samples_to_table([sample("x", PROMPT, GOOD)]), folder / "part-1.parquet")
    data = figures(*tally(tmp_path), SPEC)
    assert data["cache"]["share"] is None and data["cache"]["prompt_tokens"] == 3
    for chart in CHARTS:
        if chart.name.startswith("cache_hits"):
            svg, marks = draw(chart, data)
            assert marks == 0 and NO_CACHE_FIGURES in svg


def test_consistency_lists_each_value_found_in_the_shards(shards):
    data = figures(*tally(shards), SPEC)
    assert data["consistency"]["tokenizer_fingerprint"] == {"tok-fp": 6}
    assert data["consistency"]["temperature"] == {"0.6": 6}
    assert sum(sum(row) for row in data["prompt_vs_output"]["counts"]) == 6


def test_an_empty_run_has_figures_without_samples(tmp_path):
    data = figures(SampleTally(SPEC), LetterTally(SPEC), SPEC)
    assert data["samples"] == {"rows": 0, "unique_ids": 0, "duplicate_rows": 0}
    assert data["lengths"]["output"]["n"] == 0 and data["servers"] == []
    assert json.loads(json.dumps(data)) == data


def test_batch_size_does_not_change_the_figures(shards):
    one = figures(*tally(shards, batch_rows=1), SPEC)
    many = figures(*tally(shards, batch_rows=1000), SPEC)
    assert one == many


def test_exact_histogram_quantiles_match_numpy_nearest_rank():
    rng = np.random.default_rng(7)
    values = rng.integers(0, 5000, size=2000)
    counts = Counts()
    for chunk in np.array_split(values, 7):
        counts.add(chunk)
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        assert counts.quantile(q) == int(np.percentile(values, 100 * q, method="inverted_cdf"))
    assert counts.total() == values.sum() and sum(counts.bins(4999, 60)["counts"]) == 2000


def test_a_folding_grid_keeps_every_sum_in_a_bounded_number_of_buckets():
    grid = FoldingGrid(2, (1.0, 1.0), cells=16)
    grid.add((np.array([0, 3, 1000]), np.array([0, 5, 7])), np.array([1.0, 2.0, 4.0]))
    grid.add((np.array([100_000]), np.array([2])))
    assert grid.sums.shape == (16, 16) and grid.sums.sum() == 8.0
    assert grid.widths[0] * 16 > 100_000 and grid.widths[1] == 1.0


def test_log_histogram_quantile_is_within_a_bucket_of_the_value():
    latency = LogHistogram()
    latency.add(np.array([0.5] * 9 + [20.0]))
    assert 0.5 <= latency.quantile(0.5) <= 0.5 * 10 ** (1 / 20) and latency.max == 20.0 and latency.n == 10


def test_picks_keep_the_k_smallest_keys_with_ties_broken_by_the_smallest_id():
    picks = Picks(2)
    picks.offer_many(np.array([5, 1, 1, 3]), ["e", "d", "b", "a"])
    assert picks.ids() == ["b", "d"]
    largest = Picks(1, largest=True)
    largest.offer_many(np.array([5, 1, 9]), ["x", "y", "z"])
    assert largest.ids() == ["z"]


def test_the_page_is_self_contained_and_embeds_its_figures(shards):
    from producer.report.charts import CHARTS, draw
    from producer.report.page import page

    data = figures(*tally(shards), SPEC)
    charts = [(chart, *draw(chart, data)) for chart in CHARTS]
    status = {"run": "t", "prompts": 9, "done": 5, "dead": 4, "pending": 0, "output_tokens": 127,
              "finished": True, "dead_by_reason": {}}
    text = page(SPEC, status, data, charts, [], {"at": "now", "shards": 2, "folder": "x"})
    # nothing is fetched: no external src/href, no stylesheet link, no CSS import or url()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<link" not in text and "@import" not in text and not re.search(r"url\(\s*['\"]?(https?:)?//", text)
    blob = re.search(r"<script type='application/json' id='report-data'>(.*?)</script>", text, re.S)[1]
    assert json.loads(blob)["figures"] == json.loads(json.dumps(data))
    for chart, svg, marks in charts:
        assert marks > 0, chart.name
        assert len(re.findall(rf'id="mark-{chart.name}-\d+"', svg)) == marks
