"""Specification: a sample's ledger key and its seed (contract/samples.py)."""
import pytest

from contract.samples import row_key, sample_key, sample_seed, split_sample_key


def test_a_run_of_one_sample_keys_each_prompt_by_its_own_id():
    assert sample_key("q1", 0, 1) == "q1"
    assert split_sample_key("q~1", 1) == ("q~1", 0)


@pytest.mark.parametrize("prompt_id", ["q1", "a~1", "x~", "~", "gsm8k/12#3"])
def test_with_several_samples_every_key_splits_back_into_its_prompt_and_index(prompt_id):
    for index in (0, 1, 7):
        key = sample_key(prompt_id, index, 8)
        assert split_sample_key(key, 8) == (prompt_id, index)


def test_two_prompts_whose_ids_look_like_keys_never_share_a_key():
    keys = {sample_key(p, i, 2) for p in ("a", "a~1", "a~0") for i in (0, 1)}
    assert len(keys) == 6


def test_a_key_without_an_index_is_refused():
    with pytest.raises(ValueError, match="not a sample key"):
        split_sample_key("q1", 4)


def test_a_row_without_a_sample_column_is_sample_zero():
    assert row_key("q1", None, 3) == "q1~0" and row_key("q1", None, 1) == "q1"


def test_seeds_are_the_same_on_a_rerun_and_differ_between_samples_prompts_and_runs():
    seeds = [sample_seed("run", "q1", i) for i in range(16)]
    assert seeds == [sample_seed("run", "q1", i) for i in range(16)]
    assert len(set(seeds)) == 16 and all(0 <= s < 2**31 for s in seeds)
    assert sample_seed("run", "q2", 0) != seeds[0] and sample_seed("other", "q1", 0) != seeds[0]


def test_a_lines_own_seed_is_the_first_samples_and_counts_up():
    assert [sample_seed("run", "q1", i, line_seed=41) for i in range(3)] == [41, 42, 43]
    assert sample_seed("run", "q1", 1, line_seed=2**31 - 1) == 0
