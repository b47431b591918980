"""The CPU-bound signal: a worker process at its CPU limit while its servers have free slots says so, once.

Given readings of the process's CPU share and its servers' free slots, when
they point one way for the whole window, then the state changes once; a
reading that breaks the streak restarts it, leaving needs a lower share than
entering (hysteresis), and full servers are never the worker's fault.
"""
from __future__ import annotations

import logging
import os

import pytest

from workers.servers.capacity import Load
from workers.servers.cpu_bound import (REMEDY, CpuBoundRule, CpuWatch, Reading, busy_node_note, idle_seconds,
                                       remedy_for, share_of_chance)
from workers.servers.cpu_limits import GIL, CoreLimit
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


def test_the_watch_logs_each_change_once_and_its_snapshot_names_the_remedy(caplog):
    # Any CPU use counts as busy and none as idle: the measurement itself is not under test here.
    watch = CpuWatch(CpuBoundRule(enter=0.0, leave=0.0, window=0.0), CoreLimit(1.0, GIL))
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
    assert cpu_line(quiet) == "42% of 1 core; servers 3 of 64 slots free"
    bound = {**quiet, "bound": True, "share": 0.97, "free_slots": 90, "slots": 256, "remedy": REMEDY}
    assert cpu_line(bound) == f"CPU-BOUND: 97% of 1 core; servers 90 of 256 slots free; {REMEDY}"


def test_servers_between_room_and_full_keep_a_bound_worker_bound():
    # Given a bound worker whose servers now have a tenth of their slots free (less than the eighth
    # it needs to turn bound, more than the sixteenth that counts as full)
    rule = CpuBoundRule(window=10.0, bound=True)
    between = Reading(share=0.97, free_slots=26, slots=256)
    # Then it stays bound: the servers' room has hysteresis too
    assert feed(rule, [between] * 5) == [False] * 5 and rule.bound


def test_a_busy_node_leaves_the_process_less_than_its_core_and_that_counts_as_its_chance():
    # A process that used half the wall time while its CPUs never sat idle had its whole chance
    assert share_of_chance(used=0.5, wall=1.0, idle=0.0, cores=1.0) == pytest.approx(1.0)
    # one that used a third while a tenth of a core sat idle had a bit more than it used
    assert share_of_chance(used=0.3, wall=1.0, idle=0.1, cores=1.0) == pytest.approx(0.75)
    # one that used a third on a node with cores to spare had its whole core: a third
    assert share_of_chance(used=0.3, wall=1.0, idle=1.4, cores=1.0) == pytest.approx(0.3)
    # and where the idle time is unknown, the cores alone are its chance
    assert share_of_chance(used=0.3, wall=1.0, idle=None, cores=1.0) == pytest.approx(0.3)


def test_an_idle_process_on_a_busy_node_is_not_at_its_limit():
    # Given a process that used a hundredth of its core (its run over) on a node whose CPUs never
    # sat idle: it was not asking for CPU, so its core alone is its chance
    assert share_of_chance(used=0.01, wall=1.0, idle=0.0, cores=1.0) == pytest.approx(0.01)
    # while one that used a quarter of it on that node had its whole chance
    assert share_of_chance(used=0.25, wall=1.0, idle=0.0, cores=1.0) == pytest.approx(1.0)


def test_under_a_quota_its_fraction_of_a_core_is_the_chance_however_idle_the_node():
    # Given a quarter-core quota on a node with idle cores: the quarter it used is all of its chance
    assert share_of_chance(used=0.25, wall=1.0, idle=1.5, cores=0.25) == pytest.approx(1.0)
    assert share_of_chance(used=0.08, wall=1.0, idle=1.5, cores=0.25) == pytest.approx(0.32)
    # and a node busier than the quota is the tighter limit
    assert share_of_chance(used=0.1, wall=1.0, idle=0.0, cores=0.25) == pytest.approx(1.0)


def test_the_idle_time_of_the_processs_own_cpus_is_read_from_proc_stat(tmp_path):
    # Given /proc/stat's lines (user nice system idle iowait ...), in clock ticks
    stat = tmp_path / "stat"
    stat.write_text("cpu  300 0 30 5000 70 0 0 0 0 0\ncpu0 100 0 10 1000 20 0 0 0 0 0\n"
                    "cpu1 200 0 20 4000 50 0 0 0 0 0\nintr 1 2 3\n")
    tick = os.sysconf("SC_CLK_TCK")
    # Then idle and iowait of the CPUs it may use are summed, the others' and the total line left out
    assert idle_seconds([0], stat) == pytest.approx(1020 / tick)
    assert idle_seconds([0, 1], stat) == pytest.approx(5070 / tick)
    assert idle_seconds([0], tmp_path / "none") is None
    # and CPUs it does not list (a container's numbering) are unknown, not never idle
    assert idle_seconds([7], stat) is None
    # and this machine's own never go back
    first = idle_seconds(os.sched_getaffinity(0))
    assert first is not None and idle_seconds(os.sched_getaffinity(0)) >= first


def test_under_a_quota_below_one_core_the_remedy_is_the_quota_and_the_file_that_sets_it(caplog):
    # Given a worker held by its cgroup's quota to a quarter of a core (any CPU use counts as busy here)
    limit = CoreLimit(0.25, "/sys/fs/cgroup/cpu/fleet/cpu.cfs_quota_us")
    watch = CpuWatch(CpuBoundRule(enter=0.0, leave=0.0, window=0.0), limit)
    with caplog.at_level(logging.WARNING, logger="workers.servers.cpu_bound"):
        watch.observe(free_slots=90, slots=256)
    (record,) = caplog.records
    # Then its line names the quota and its file, not another process in the same group (which shares it)
    line = record.getMessage()
    assert "of the 0.25 cores it can use" in line and remedy_for(limit) in line and REMEDY not in line
    assert "cpu.cfs_quota_us" in remedy_for(limit) and "0.25 cores" in remedy_for(limit)
    # and its heartbeat's remedy is the same
    assert watch.snapshot()["remedy"] == remedy_for(limit)


def test_a_busy_node_is_said_beside_another_process_but_not_beside_a_quota():
    # A whole core's process on a node that left a fifth of a core idle: the node is busy, said
    assert "sat idle 0.2 cores" in busy_node_note(idle=0.2, cores=1.0)
    # with a core and a half idle, or unknown: nothing to add
    assert busy_node_note(idle=1.5, cores=1.0) == busy_node_note(idle=None, cores=1.0) == ""
    # and under a quarter-core quota the quota is the remedy, however busy the node
    assert busy_node_note(idle=0.0, cores=0.25) == ""
