"""The stand-in's radix prefix cache: what a scheduled prompt finds cached, and what is dropped.

Given a `PrefixCache` of a stated size, when sequences are inserted and
prompts matched in a stated order, then `cached_tokens` is exactly the
longest cached prefix (at most the prompt's length - 1, as SGLang computes
at least one token), least recently used leaves go first when the bound is
passed, and a size of 0 caches nothing. The engine specs drive the time
model in instant mode: a finished request's prompt and output are cached.
"""
from __future__ import annotations

import asyncio
import dataclasses

from sglang_standin.batching import Engine, Job
from sglang_standin.config import StandinConfig
from sglang_standin.prefix_cache import PrefixCache
from sglang_standin.stats import Stats

SYSTEM = list(range(1000, 1100))  # a 100-token shared system prompt


def test_a_prompt_sharing_a_cached_prefix_finds_exactly_that_prefix():
    cache = PrefixCache(10_000)
    cache.insert(SYSTEM + [1, 2, 3])
    assert cache.cached_prompt_tokens(SYSTEM + [7, 8]) == 100
    assert cache.cached_prompt_tokens(SYSTEM[:40] + [5] + SYSTEM[41:]) == 40
    assert cache.cached_prompt_tokens([5] + SYSTEM) == 0


def test_an_identical_prompt_leaves_one_token_to_compute():
    cache = PrefixCache(10_000)
    cache.insert(SYSTEM)
    assert cache.cached_prompt_tokens(SYSTEM) == 99
    assert cache.cached_prompt_tokens(SYSTEM[:1]) == 0


def test_a_prompt_diverging_inside_an_edge_splits_it_and_both_branches_stay_cached():
    cache = PrefixCache(10_000)
    cache.insert(SYSTEM + [1, 2, 3])
    cache.insert(SYSTEM[:50] + [9, 9])
    assert cache.size == 103 + 2
    assert cache.cached_prompt_tokens(SYSTEM + [1, 2, 3, 4]) == 103
    assert cache.cached_prompt_tokens(SYSTEM[:50] + [9, 9, 4]) == 52


def test_over_the_bound_the_least_recently_used_leaf_is_evicted_first():
    # given a 30-token cache holding three 10-token sequences, a used after b and c
    cache = PrefixCache(30)
    a, b, c = ([k] * 10 for k in (1, 2, 3))
    for seq in (a, b, c):
        cache.insert(seq)
    assert cache.match(a) == 10
    # when a fourth sequence needs room
    cache.insert([4] * 10)
    # then b (least recently used) is gone and the rest are whole
    assert [cache.match(s) for s in (a, b, c, [4] * 10)] == [10, 0, 10, 10]
    assert cache.size == 30


def test_a_shared_prefix_outlives_the_branches_evicted_below_it():
    # given two branches under a shared 10-token prefix, in a 26-token cache
    cache = PrefixCache(26)
    shared = [7] * 10
    cache.insert(shared + [1] * 8)
    cache.insert(shared + [2] * 8)
    # when an unrelated 8-token sequence is inserted
    cache.insert([3] * 8)
    # then the older branch goes, the prefix and the newer branch stay
    assert cache.match(shared + [1] * 8) == 10
    assert cache.match(shared + [2] * 8) == 18
    assert cache.size == 26


def test_a_sequence_longer_than_the_cache_keeps_its_first_tokens():
    cache = PrefixCache(50)
    cache.insert(SYSTEM)
    assert cache.size == 50
    assert cache.cached_prompt_tokens(SYSTEM) == 50


def test_memory_stays_bounded_over_many_distinct_prompts():
    cache = PrefixCache(1_000)
    for k in range(2_000):
        cache.insert([k, k + 1, k + 2, k + 3, k + 4])
        assert cache.size <= 1_000
    assert len(cache._heap) <= 2 * cache._nodes + 64
    assert cache.match([1999, 2000, 2001, 2002, 2003]) == 5


def test_a_disabled_cache_finds_nothing():
    cache = PrefixCache(0)
    cache.insert(SYSTEM)
    assert cache.size == 0 and cache.cached_prompt_tokens(SYSTEM + [1]) == 0


def test_clear_forgets_everything():
    cache = PrefixCache(1_000)
    cache.insert(SYSTEM)
    cache.clear()
    assert cache.size == 0 and cache.cached_prompt_tokens(SYSTEM + [1]) == 0


def _run(cfg: StandinConfig, requests: list[tuple[list[int], list[int]]]) -> tuple[list[int], Stats]:
    """Submit requests one after another (each waits for the previous); their cached_tokens."""
    async def go() -> list[int]:
        engine, cached = Engine(cfg, stats), []
        for prompt, output in requests:
            job = Job("r", prompt, output)
            assert engine.submit([job])
            cached.append((await job.outcome).cached)
        await engine.close()
        return cached
    stats = Stats()
    return asyncio.run(go()), stats


INSTANT = StandinConfig(step_base=0, step_per_request=0, prefill_per_token=0)


def test_generated_tokens_are_cached_all_but_the_last():
    # given turn 1 (prompt p1, output o1) finished, when turn 2 starts with p1 + o1
    p1, o1 = SYSTEM[:20], [5, 6, 7, 8]
    cached, stats = _run(INSTANT, [(p1, o1), (p1 + o1 + [9, 10], [1])])
    # then turn 2 finds p1 and o1 but o1's last token (its KV was never computed)
    assert cached == [0, 20 + 3]
    assert (stats.prompt_tokens, stats.cached_tokens) == (20 + 26, 23)


def test_the_engine_caches_nothing_when_the_cache_is_disabled():
    cached, stats = _run(dataclasses.replace(INSTANT, prefix_cache_tokens=0), [(SYSTEM, [1, 2]), (SYSTEM, [1])])
    assert cached == [0, 0] and stats.cached_tokens == 0 and stats.prompt_tokens == 200


def test_the_timed_engine_caches_the_prompt_after_its_prefill_step():
    # given a timed engine: a long request on the system prompt, then a second one while it runs
    cfg = StandinConfig(step_base=0.001, step_per_request=0, prefill_per_token=0)

    async def go() -> tuple[int, int]:
        engine = Engine(cfg, Stats())
        first = Job("a", SYSTEM + [1], list(range(200, 400)))
        assert engine.submit([first])
        while engine.step < 2:  # the first request's prefill step is over
            await engine.progress_signal()
        second = Job("b", SYSTEM + [2], [3])
        assert engine.submit([second])
        result = (await second.outcome).cached
        engine.abort(None)
        await engine.close()
        return result, first.cached
    # then the second finds the whole system prompt though the first has not finished
    assert asyncio.run(go()) == (100, 0)


def test_prefill_is_charged_only_for_the_uncached_prompt_tokens():
    # given a timed engine whose cache holds the system prompt
    cfg = StandinConfig(step_base=1.0, step_per_request=0, prefill_per_token=0.001)

    async def go() -> list[int]:
        engine = Engine(cfg, Stats())
        engine.cache.insert(SYSTEM)
        charged = []
        # when a prompt extending it, then an unrelated one, are admitted before the first step
        for prompt in (SYSTEM + [1, 2], [5] * 10):
            assert engine.submit([Job("r", prompt, [3, 4])])
            charged.append(engine.pending_prefill_tokens)
        engine.abort(None)
        await engine.close()
        return charged
    # then the next step pays for 2 tokens of the first and all 10 of the second
    assert asyncio.run(go()) == [2, 12]
