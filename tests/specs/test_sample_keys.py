"""Specification: a sample's ledger key and its seed (contract/run/samples.py)."""
import pytest

from contract.run.samples import (first_indices, resample_seed, row_key, sample_key, sample_seed, split_sample_key,
                                  successor)


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


def test_a_resample_asks_a_seed_of_its_own_the_same_on_a_rerun():
    # Given the seeds of a prompt's samples, drawn or counted up from a line's own seed
    for seeds in ([sample_seed("run", "q1", i) for i in range(8)], [sample_seed("run", "q1", i, 41) for i in range(8)]):
        # When each is resampled
        again = [resample_seed(s) for s in seeds]
        # Then each resample asks another seed, none of them another sample's, the same on a re-run
        assert not set(again) & set(seeds) and len(set(again)) == len(seeds)
        assert again == [resample_seed(s) for s in seeds] and all(0 <= s < 2**31 for s in again)


def test_without_until_verified_every_sample_is_queued_up_front_and_none_follows():
    assert list(first_indices(4, None)) == [0, 1, 2, 3] and successor(0, 4, None) is None


def test_until_verified_queues_k_chains_each_stepping_k_up_to_n():
    assert list(first_indices(8, 2)) == [0, 1]
    assert [successor(i, 8, 2) for i in range(8)] == [2, 3, 4, 5, 6, 7, None, None]
    assert list(first_indices(3, 5)) == [0, 1, 2] and successor(2, 3, 5) is None


def test_every_sample_below_n_is_in_exactly_one_chain():
    for n, k in ((8, 3), (5, 1), (7, 7), (10, 4)):
        chains = []
        for start in first_indices(n, k):
            chain, index = [], start
            while index is not None:
                chain.append(index)
                index = successor(index, n, k)
            chains.append(chain)
        assert sorted(i for c in chains for i in c) == list(range(n)) and len(chains) == min(k, n)
