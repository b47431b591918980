"""Concurrency that tunes itself: capacity read from what SGLang reports, and the rule that moves a target.

Given the bodies SGLang's routes answer (and the gateway's), when the worker
reads them, then it finds the server's capacity and load; given a window of
load reports, when the tuner adjusts, then the running batch stays full with a
short queue, inside [1, FLEET_MAX_INFLIGHT_PER_SERVER]. Routing gives servers
of different sizes each their fill.
"""
from __future__ import annotations

from contextlib import ExitStack

import pytest

from contract.redis_link.clock import CLOCK
from contract.keys import SHARERS_PREFIX
from contract.names import ServerState
from workers.servers import sharers
from workers.servers.capacity import (Load, Tuner, capacity_from_loads, capacity_from_server_info,
                              initial_target, load_from_loads, load_from_meta, retarget)
from workers.servers.load import listed_workers
from workers.servers.bindings import ServerPool


@pytest.mark.parametrize("info, expected", [
    ({"max_running_requests": None, "dp_size": 1,
      "internal_states": [{"effective_max_running_requests_per_dp": 128}]}, 128),   # 2025-26: derived from memory
    ({"max_running_requests": 64, "dp_size": 1, "internal_states": [{}]}, 64),      # the launch argument
    ({"max_running_requests": None, "dp_size": 4,
      "internal_states": [{"effective_max_running_requests_per_dp": 256}] * 4}, 1024),  # one entry per DP rank
    ({"max_running_requests": None, "dp_size": 8,
      "internal_states": [{"effective_max_running_requests_per_dp": 256}]}, 2048),  # one entry for all ranks
    ({"max_running_requests": 32, "dp_size": 2}, 64),
    ({"max_running_requests": None}, None),                                         # an old build: not said
    ({"internal_states": [{"effective_max_running_requests_per_dp": "lots"}]}, None),
    ({}, None),
])
def test_capacity_is_read_from_server_info(info, expected):
    assert capacity_from_server_info(info) == expected


def test_capacity_and_load_are_read_from_v1_loads_and_get_load():
    v1 = {"loads": [{"dp_rank": 0, "num_running_reqs": 60, "num_waiting_reqs": 5, "max_running_requests": 64},
                    {"dp_rank": 1, "num_running_reqs": 64, "num_waiting_reqs": 0, "max_running_requests": 64}]}
    assert capacity_from_loads(v1) == 128
    assert load_from_loads(v1) == Load(124, 5)
    legacy = [{"dp_rank": 0, "num_reqs": 70, "num_waiting_reqs": 6, "num_tokens": 9000}]
    assert load_from_loads(legacy) == Load(64, 6)      # num_reqs counts running and waiting
    gateway = {"loads": [{"worker": "http://a", "load": 9000}], "total_workers": 1}
    assert load_from_loads(gateway) is None            # the gateway reports tokens, not requests
    assert capacity_from_loads(gateway) is None


def test_load_is_read_from_meta_info_where_sglang_puts_it():
    assert load_from_meta({"num_running_reqs": 63, "num_waiting_reqs": 2}) == Load(63, 2)
    assert load_from_meta({"completion_tokens": 5}) is None  # builds before 2026


def test_a_gateway_is_recognised_by_its_worker_listing():
    new = {"workers": [{"url": "http://a:1/", "is_healthy": True}, {"url": "http://b:2", "is_healthy": False}],
           "total": 2}
    assert listed_workers(new) == ["http://a:1"]
    assert listed_workers({"urls": ["http://a:1", "http://b:2"]}) == ["http://a:1", "http://b:2"]
    assert listed_workers({"detail": "Not Found"}) is None
    assert listed_workers(None) is None


@pytest.mark.parametrize("capacity, bound, expected", [
    (64, 1024, 72), (256, 1024, 288),         # the batch and an eighth of it waiting
    (8, 1024, 10), (1, 1024, 3),              # never fewer than two waiting
    (256, 100, 100),                          # FLEET_MAX_INFLIGHT_PER_SERVER bounds it
    (None, 1024, 128),                        # a server that does not say: 128 in flight
    (None, 16, 16),
])
def test_a_fresh_target_is_the_batch_plus_a_short_queue(capacity, bound, expected):
    assert initial_target(capacity, bound) == expected


# (situation, target, capacity, lowest waiting, highest waiting, highest running, held full, share, expected)
SITUATIONS = [
    ("batch full, short queue: keep", 72, 64, 3, 8, 64, True, 1.0, 72),
    ("a queue as long as the batch, this worker holds half the server: half of batch + headroom",
     72, 64, 64, 70, 64, True, 0.5, 36),
    ("a queue while the server runs fewer than its capacity (it retracts): share of what it runs + headroom",
     72, 64, 30, 40, 40, True, 1.0, 48),
    ("the queue of the last window still draining: never grow on a shrink", 24, 64, 100, 140, 64, True, 0.33,
     24),
    ("queue just over twice the headroom, a third of the server: a third of batch + headroom",
     30, 64, 17, 20, 64, True, 1 / 3, 24),
    ("a momentary queue (its low point is short): keep", 72, 64, 0, 40, 64, True, 1.0, 72),
    ("slots free, nothing waiting, target held, alone: grow by the free slots", 72, 64, 0, 0, 50, True, 1.0, 86),
    ("the same, a third of the server: grow by a third of them", 24, 64, 0, 0, 49, True, 1 / 3, 29),
    ("slots free but the worker did not hold its target (no work): keep", 72, 64, 0, 0, 10, False, 1.0, 72),
    ("slots free but something waited: keep", 72, 64, 0, 1, 60, True, 1.0, 72),
    ("unknown capacity, nothing waiting, held: grow by an eighth", 128, None, 0, 0, 128, True, 1.0, 144),
    ("never above the bound", 1000, 1024, 0, 0, 900, True, 1.0, 1024),
    ("never below one (others hold nearly all of a long queue)", 3, 8, 500, 500, 8, True, 0.001, 1),
]


@pytest.mark.parametrize("situation, target, capacity, low, high, running, held, share, expected", SITUATIONS,
                         ids=[s[0] for s in SITUATIONS])
def test_the_rule_keeps_the_batch_full_with_a_short_queue(situation, target, capacity, low, high, running, held,
                                                          share, expected):
    assert retarget(target, capacity, low, high, running, held, bound=1024, share=share) == expected


def test_the_tuner_moves_at_most_once_a_window_on_its_extremes():
    tuner = Tuner(bound=1024, capacity=64)
    assert tuner.target == 72
    # Every answer of a saturated server shows one slot just freed: alone, that must not grow the target.
    assert not tuner.observe(Load(63, 4), in_flight=72, now=0.0)
    assert not tuner.observe(Load(63, 0), in_flight=72, now=0.5)
    assert not tuner.observe(Load(64, 3), in_flight=72, now=1.0)  # something waited in the window: keep
    assert tuner.target == 72
    # A second worker arrives: the queue stays long for a whole window.
    tuner.observe(Load(64, 70), in_flight=72, now=1.5)
    assert tuner.observe(Load(64, 66), in_flight=72, now=2.1)
    # its share (72 of 134, then 72 of 130: 0.545) of the batch and its headroom (72): 40
    assert tuner.target == 40


def share_one_server(workers: int, capacity: int, windows: int) -> list[list[int]]:
    """`workers` tuners filling one server that runs `capacity` at once and queues the rest: their
    targets after each window (each holds its whole target; the server sees every request)."""
    tuners = [Tuner(bound=1024, capacity=capacity) for _ in range(workers)]
    history = []
    for window in range(windows):
        total = sum(t.target for t in tuners)
        load = Load(min(total, capacity), max(total - capacity, 0))
        for t in tuners:
            t.observe(load, in_flight=t.target, now=float(window))
        history.append([t.target for t in tuners])
    return history


def test_a_queue_still_draining_after_a_shrink_does_not_shrink_again():
    # Given a worker that just shrank from 72 to 24 (two others share the server)
    tuner = Tuner(bound=1024, capacity=64, target=24)
    # When the queue it built before is still long while it holds more than its new target
    tuner.observe(Load(64, 120), in_flight=60, now=0.0)
    tuner.observe(Load(64, 100), in_flight=50, now=1.0)
    # Then it waits for its requests to drain
    assert tuner.target == 24
    # and shrinks again only once it holds no more than its target and the queue is still long
    tuner.observe(Load(64, 60), in_flight=24, now=2.0)
    tuner.observe(Load(64, 60), in_flight=24, now=3.0)
    assert tuner.target == 14  # its share, 24 of 124, of the batch and its headroom (72), rounded up


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_workers_sharing_a_server_together_give_back_the_excess_once_and_stay_equal(workers):
    # Given several workers bound to one batch-64 server, each starting at capacity + headroom (72)
    history = share_one_server(workers, capacity=64, windows=6)
    # Then after the first window together they hold the batch and its headroom, never fewer than the batch
    for targets in history[1:]:
        assert 64 <= sum(targets) <= 64 + 8 + workers, history
    # and each holds the same share (within the rounding of one request)
    assert max(history[-1]) - min(history[-1]) <= 1, history


@pytest.mark.parametrize("sharers, expected", [(1, 72), (2, 36), (3, 24), (4, 18), (100, 1)])
def test_workers_sharing_a_server_start_at_their_share_of_the_batch_and_its_headroom(sharers, expected):
    assert initial_target(64, 1024, sharers) == expected


def test_a_target_follows_the_count_of_sharers_until_the_load_first_moves_it():
    # Given a worker alone on a batch-64 server (72 in flight)
    tuner = Tuner(bound=1024, capacity=64)
    # When three more workers bound to it show up in Redis before any load
    assert tuner.shared_by(4) and tuner.target == 18
    # Then four such workers together hold the batch and its headroom from the start
    history = [[18] * 4]
    tuners = [Tuner(bound=1024, capacity=64, sharers=4) for _ in range(4)]
    for window in range(4):
        total = sum(t.target for t in tuners)
        for t in tuners:
            t.observe(Load(min(total, 64), max(total - 64, 0)), in_flight=t.target, now=float(window))
        history.append([t.target for t in tuners])
    assert all(sum(targets) == 72 for targets in history), history
    # and once the load has moved a target, the count no longer does (the share rule does)
    tuner.observe(Load(20, 0), in_flight=18, now=0.0)
    assert tuner.observe(Load(20, 0), in_flight=18, now=1.0) and tuner.target > 18
    moved = tuner.target
    assert not tuner.shared_by(2) and tuner.target == moved
    # and a restarted server starts again from the share
    tuner.reset(64)
    assert tuner.target == 36


def fill_shared(targets: list[int], capacity: int, windows: int, idle: int = 0) -> list[list[int]]:
    """Busy tuners (holding their whole targets) and `idle` sharers holding nothing on one server of
    `capacity`, every sharer counted; their targets after each window."""
    tuners = [Tuner(bound=1024, capacity=capacity, target=t, sharers=len(targets) + idle) for t in targets]
    history = []
    for window in range(windows):
        total = sum(t.target for t in tuners)
        for t in tuners:
            t.observe(Load(min(total, capacity), max(total - capacity, 0)), in_flight=t.target, now=float(window))
        history.append([t.target for t in tuners])
    return history


def test_sharers_whose_targets_drifted_apart_on_a_full_server_even_out():
    # Given four workers on a gateway of 128 slots whose targets one window's timing set apart
    history = fill_shared([48, 32, 32, 32], capacity=128, windows=4)
    # Then those below their part (144 / 4 = 36) take it, and the one above gives back the excess
    assert history[-1] == [36, 36, 36, 36], history
    # and together they never held less than the batch
    assert all(sum(targets) >= 128 for targets in history), history


def test_a_worker_whose_sharers_are_idle_keeps_their_slots():
    # Given three busy workers holding the batch and its headroom, a fourth bound but idle
    history = fill_shared([48, 48, 48], capacity=128, windows=4, idle=1)
    # Then nobody gives back slots the idle one does not want
    assert history[-1] == [48, 48, 48], history


def test_a_restarted_server_starts_again_from_its_capacity():
    tuner = Tuner(bound=1024, capacity=64)
    tuner.observe(Load(64, 200), in_flight=72, now=0.0)
    tuner.observe(Load(64, 200), in_flight=72, now=1.0)
    assert tuner.target < 72
    tuner.reset(256)
    assert (tuner.capacity, tuner.target) == (256, 288)


def _small_and_large() -> ServerPool:
    """Two healthy servers behind one worker: batch 64 and batch 256."""
    pool = ServerPool(["small", "large"], max_inflight=1024)
    for binding in pool.bindings:
        binding.state, binding.preflighted = ServerState.HEALTHY, True
    pool.reset_capacity(pool.bindings[0], 64)
    pool.reset_capacity(pool.bindings[1], 256)
    return pool


def test_servers_of_different_sizes_behind_one_worker_each_get_their_fill():
    pool = _small_and_large()
    with ExitStack() as held:
        for _ in range(72 + 288):
            held.enter_context(pool.acquire(None, 0.1))
        assert [b.in_flight for b in pool.bindings] == [72, 288]
        assert pool.targets() == 360
    assert [b.in_flight for b in pool.bindings] == [0, 0]


def test_routing_fills_servers_in_proportion_to_their_targets():
    pool = _small_and_large()
    with ExitStack() as held:
        for _ in range(90):
            held.enter_context(pool.acquire(None, 0.1))
        small, large = (b.in_flight for b in pool.bindings)
        assert abs(small / 72 - large / 288) < 0.05


def test_a_load_report_on_a_data_parallel_server_comes_only_from_its_own_route():
    pool = ServerPool(["dp"], max_inflight=1024)
    binding = pool.bindings[0]
    binding.dp_size = 4
    pool.reset_capacity(binding, 1024)
    for now in (0.0, 1.0, 2.0):  # one rank's counts in an answer look like a quarter-empty server
        pool.observe_answer(binding, {"num_running_reqs": 256, "num_waiting_reqs": 0})
    assert binding.target == 1024  # its fresh target (1,024 + 128 waiting, within the bound of 1,024)


def test_a_servers_load_is_polled_until_its_answers_are_seen_to_carry_it():
    # Given a plain one-rank server, as SGLang 0.5.23 is: its answers carry no load
    pool = ServerPool(["s"], max_inflight=1024)
    binding = pool.bindings[0]
    pool.reset_capacity(binding, 64)
    pool.observe_answer(binding, {"completion_tokens": 5, "prompt_tokens": 9})
    # Then the health thread reads its /v1/loads every window
    assert not binding.answers_carry_load
    # When an answer carries the whole server's counts (2026 main builds), then polling stops
    pool.observe_answer(binding, {"num_running_reqs": 3, "num_waiting_reqs": 0})
    assert binding.answers_carry_load and binding.last_load == Load(3, 0)
    # And a restarted server (maybe another build) is polled again until its answers say otherwise
    pool.reset_capacity(binding, 64)
    assert not binding.answers_carry_load


def count(client, worker: str, urls: list[str], ttl: float) -> dict[str, int]:
    """One health round's sharer stamps, alone in their pipeline."""
    with client.pipeline(transaction=False) as pipe:
        counts = sharers.stamp(pipe, worker, urls, ttl, CLOCK.now(client))
        return counts(pipe.execute())


def test_the_workers_sharing_a_server_are_counted_in_redis_and_a_silent_or_stopped_one_drops_out(client):
    # Given three workers stamping themselves on one gateway each health round, one also on another server
    assert count(client, "w1", ["http://gw:30000"], ttl=10) == {"http://gw:30000": 1}
    count(client, "w2", ["http://gw:30000"], ttl=10)
    found = count(client, "w3", ["http://gw:30000", "http://other:30000"], ttl=10)
    # Then each server counts the live workers bound to it, the one asking included
    assert found == {"http://gw:30000": 3, "http://other:30000": 1}
    # When one stops and another's stamp is older than a heartbeat's life
    sharers.leave(client, "w3", ["http://gw:30000", "http://other:30000"])
    client.zadd(SHARERS_PREFIX + "http://gw:30000", {"w2": 0})
    # Then neither counts any more
    assert count(client, "w1", ["http://gw:30000"], ttl=10) == {"http://gw:30000": 1}
