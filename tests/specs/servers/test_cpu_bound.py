"""The CPU-bound signal: a worker process at its CPU limit while its servers have free slots says so, once.

Given readings of the process's CPU share and its servers' free slots, when
they point one way for the whole window, then the state changes once; a
reading that breaks the streak restarts it, leaving needs a lower share than
entering (hysteresis), and full servers are never the worker's fault.
"""
from __future__ import annotations

import logging

import pytest

from workers.servers.capacity import Load
from workers.servers.cpu_bound import (REMEDY, CpuBoundRule, CpuWatch, Reading, share_of_chance, usable_cores,
                                waited_seconds)
from workers.servers.bindings import HEALTHY, ServerPool

BUSY_WITH_ROOM = Reading(share=0.97, free_slots=90, slots=256)   # 0.657 of the ideal: one process at its core
BUSY_SERVERS_FULL = Reading(share=0.97, free_slots=4, slots=256)  # the process is busy, but so are the servers
IDLE_WITH_ROOM = Reading(share=0.30, free_slots=200, slots=256)   # little work: room, but not the CPU's fault


def feed(rule: CpuBoundRule, readings: list[Reading], start: float = 0.0, every: float = 5.0) -> list[bool]:
    return [rule.observe(r, start + i * every) for i, r in enumerate(readings)]


def test_a_busy_process_with_free_slots_turns_bound_only_after_the_whole_window():
    rule = CpuBoundRule(window=10.0)
    # 0 s, 5 s: not yet; 10 s: the condition has held for the window
    assert feed(rule, [BUSY_WITH_ROOM] * 3) == [False, False, True]
    assert rule.bound


def test_one_busy_moment_does_not_flip_it():
    rule = CpuBoundRule(window=10.0)
    assert feed(rule, [BUSY_WITH_ROOM, BUSY_WITH_ROOM, IDLE_WITH_ROOM, BUSY_WITH_ROOM, BUSY_WITH_ROOM]) == [False] * 5
    assert not rule.bound


def test_full_servers_are_not_the_workers_cpu():
    rule = CpuBoundRule(window=10.0)
    assert feed(rule, [BUSY_SERVERS_FULL] * 10) == [False] * 10
    assert not rule.bound


def test_leaving_needs_a_lower_share_than_entering_for_the_whole_window():
    rule = CpuBoundRule(enter=0.85, leave=0.70, window=10.0, bound=True)
    between = Reading(share=0.78, free_slots=90, slots=256)  # below enter, above leave: still bound
    assert feed(rule, [between] * 5) == [False] * 5 and rule.bound
    assert feed(rule, [IDLE_WITH_ROOM] * 3, start=100.0) == [False, False, True]
    assert not rule.bound


def test_servers_filling_up_ends_it_too():
    rule = CpuBoundRule(window=10.0, bound=True)
    assert feed(rule, [BUSY_SERVERS_FULL] * 3) == [False, False, True]
    assert not rule.bound


def test_no_known_capacity_means_no_claim_about_free_slots():
    assert not Reading(share=1.0, free_slots=0, slots=0).servers_have_room


def test_the_usable_cores_are_at_most_one_the_gil():
    assert 0 < usable_cores() <= 1.0


def test_the_watch_logs_each_change_once_and_its_snapshot_names_the_remedy(caplog):
    # Any CPU use counts as busy and none as idle: the measurement itself is not under test here.
    watch = CpuWatch(CpuBoundRule(enter=0.0, leave=0.0, window=0.0), cores=1.0)
    with caplog.at_level(logging.WARNING, logger="workers.servers.cpu_bound"):
        for _ in range(3):
            watch.observe(free_slots=90, slots=256)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["worker CPU-bound"]
    assert REMEDY in caplog.records[0].getMessage()
    found = watch.snapshot()
    assert (found["bound"], found["free_slots"], found["slots"], found["remedy"]) == (True, 90, 256, REMEDY)


def test_the_pool_counts_free_slots_from_each_usable_servers_last_load():
    pool = ServerPool(["http://a:1", "http://b:2", "http://c:3"], max_inflight=1024)
    a, b, c = pool.bindings
    for binding, capacity in ((a, 64), (b, 256), (c, 32)):
        binding.state, binding.preflighted = HEALTHY, True
        pool.reset_capacity(binding, capacity)
    pool.observe_load(a, Load(running=60, waiting=3), now=0.0)
    pool.observe_load(b, Load(running=170, waiting=0), now=0.0)
    # c has reported no load yet: it is left out of both counts
    assert pool.free_slots() == (4 + 86, 64 + 256)


def test_status_shows_the_share_and_while_bound_the_remedy():
    from producer.status_view import cpu_line

    assert cpu_line({}) == "unknown"  # an older worker's heartbeat
    quiet = {"bound": False, "share": 0.42, "cores": 1.0, "free_slots": 3, "slots": 64}
    assert cpu_line(quiet) == "42% of 1 core(s); servers 3 of 64 slots free"
    bound = {**quiet, "bound": True, "share": 0.97, "free_slots": 90, "slots": 256, "remedy": REMEDY}
    assert cpu_line(bound) == f"CPU-BOUND: 97% of 1 core(s); servers 90 of 256 slots free; {REMEDY}"


def test_servers_between_room_and_full_keep_a_bound_worker_bound():
    # Given a bound worker whose servers now have a tenth of their slots free (less than the eighth
    # it needs to turn bound, more than the sixteenth that counts as full)
    rule = CpuBoundRule(window=10.0, bound=True)
    between = Reading(share=0.97, free_slots=26, slots=256)
    # Then it stays bound: the servers' room has hysteresis too
    assert feed(rule, [between] * 5) == [False] * 5 and rule.bound


def test_time_spent_waiting_for_a_core_counts_as_cpu_the_process_wanted():
    # A process that used half the wall time and waited for a core the other half had its whole chance
    assert share_of_chance(used=0.5, wall=1.0, waited=0.5, cores=1.0) == pytest.approx(1.0)
    # one that used a third and waited little did not
    assert share_of_chance(used=0.3, wall=1.0, waited=0.1, cores=1.0) == pytest.approx(0.3 / 0.9)
    # waits summed over threads that overlap never make the share exceed what it used of its chance
    assert share_of_chance(used=0.2, wall=1.0, waited=3.0, cores=1.0) == pytest.approx(1.0)
    # and under a quota of half a core, half a core used is all of it
    assert share_of_chance(used=0.5, wall=1.0, waited=0.0, cores=0.5) == pytest.approx(1.0)


def test_the_waits_for_a_core_are_read_from_the_kernel_and_never_go_back():
    first = waited_seconds()
    assert first is not None and first >= 0
    assert waited_seconds() >= first
