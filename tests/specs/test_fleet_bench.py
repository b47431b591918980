"""The fleet-size bench's projection: n nodes cost n times a node's work, plus the audit once.

A node at `rate` samples a second pays `rate` samples, its periodic work per
second, and its task-event flushes (at most one a FLEET_TASK_EVENTS_INTERVAL, fewer when it
stores fewer); the audit runs once per interval for the whole fleet, whatever n.
At node rate a node batches what its rate lets it: a group commit holds the
samples stored while its oldest waited, and kombu's next take as many.
"""
from __future__ import annotations

from types import SimpleNamespace

import redis

from bench.fleet_figures import project, project_node_rate, projections
from bench.fleet_nodes import _first_command, node_shape
from bench.fleet_size import FleetOptions


def measured(per_sample_us: float, per_worker_s_us: float, event_us: float, audit_ms: float) -> dict:
    return {"samples": {"redis_us_per_sample": per_sample_us, "commands_per_sample": 10.0, "connections": 4},
            "redis_us_per_worker_s": per_worker_s_us, "commands_per_worker_s": 5.0,
            "rounds": {"worker-heartbeat event": {"redis_us": event_us}},
            "audit": {"redis_ms_per_round": audit_ms}}


def test_nodes_cost_their_samples_periodic_work_and_events_and_the_audit_once():
    # Given 100 us a sample, 50 us a worker-second, 30 us an event flush (one each 2 s), a 30 ms audit round
    opts = FleetOptions(rate=2.0, nodes=[100, 5000])
    p = project(measured(100.0, 50.0, 30.0, 30.0), opts, SimpleNamespace(audit_interval=30.0, task_events_interval=2.0))
    # Then a node costs 2 x 100 + 50 + half a flush, and the audit 1 ms a second for all
    assert p["per_node_us_per_s"] == 2 * 100 + 50 + 0.5 * 30
    assert p["audit_us_per_s"] == 1000.0
    assert p["nodes"][5000]["cores"] == (5000 * p["per_node_us_per_s"] + 1000.0) / 1e6
    # and connections and prompts in flight scale with the nodes
    assert p["nodes"][5000]["connections"] == 20_000 and p["nodes"][100]["in_flight"] == 25_600


def at_node_rate(per_sample_us: float, round_trips: float, per_worker_s_us: float, audit_ms: float) -> dict:
    return {**measured(1000.0, per_worker_s_us, 1000.0, audit_ms),
            "node_rate": {"redis_us_per_sample": per_sample_us, "commands_per_sample": 12.0,
                          "round_trips_per_sample": round_trips,
                          "redis_us_per_round_trip": per_sample_us / round_trips}}


def test_at_node_rate_a_node_costs_its_samples_with_their_events_inside_and_its_periodic_work():
    # Given 110 us a sample at node rate (its task-event flushes in the mix), 30 us a worker-second
    # and a 30 ms audit round every 30 s
    opts = FleetOptions(rate=2.0, nodes=[100, 5000])
    p = project_node_rate(at_node_rate(110.0, 2.5, 30.0, 30.0), opts, SimpleNamespace(audit_interval=30.0))
    # Then a node costs 2 x 110 + 30 (no event cost added: the samples' figure holds it)
    assert p["per_node_us_per_s"] == 2 * 110 + 30 and p["samples_us_per_s"] == 220
    assert p["nodes"][5000]["cores"] == (5000 * 250 + 1000.0) / 1e6
    # and the goal (one core at 5,000 nodes) leaves a sample what is left after the periodic work
    # and the audit, which at 44 us a round trip is so many round trips
    budget = ((1e6 - 1000.0) / 5000 - 30) / 2.0
    assert p["sample_budget_us"] == budget and p["round_trip_budget"] == budget / 44.0


def test_both_projections_are_kept_and_the_node_rate_one_is_judged():
    # Given a real worker's sample at 1,000 us (amortized differently) and a node-rate one at 110 us
    p = projections(at_node_rate(110.0, 2.5, 30.0, 30.0), FleetOptions(),
                    SimpleNamespace(audit_interval=30.0, task_events_interval=5.0))
    # Then both are there, differing, and the node-rate one is the one judged against the goal
    assert p["judged"] == "node rate"
    assert p["real worker"]["nodes"][5000]["cores"] > p["node rate"]["nodes"][5000]["cores"]


def test_a_node_at_two_samples_a_second_commits_five_and_takes_five_and_flushes_twice_and_a_half_a_group():
    # Given FLEET_SHARD_MAX_WAIT 2 s and one event flush a second
    shape = node_shape(2.0, max_wait=2.0, group_rows=128, flush_interval=1.0)
    # Then a group holds its oldest sample and the four stored while it waited (the take after its
    # acks as many), and its 2.5 s see 2.5 flushes of 6 task events (3 a sample)
    assert (shape.group, shape.publishes, shape.events) == (5, 2.5, 6)


def test_a_slow_node_commits_samples_alone_and_flushes_only_when_it_has_events():
    # Given a node storing one sample every five seconds
    shape = node_shape(0.2, max_wait=2.0, group_rows=128, flush_interval=1.0)
    # Then each group holds one sample, and its 3 events go out in as many flushes as there are events
    assert shape.group == 1 and shape.events == 1 and abs(shape.publishes - 3.0) < 1e-9


def test_a_fast_node_commits_at_most_the_groups_rows():
    assert node_shape(1000.0, max_wait=2.0, group_rows=128, flush_interval=1.0).group == 128


def test_a_request_is_counted_once_by_its_first_command_whether_a_command_or_a_pipeline():
    connection = redis.Connection()
    assert _first_command(connection.pack_command("BRPOP", "q", "q\x06\x163", 1)) == "brpop"
    pipeline = connection.pack_commands([("EVALSHA", "ab12", 2, "k1", "k2"), ("INCR", "x"), ("WAIT", 0, 0)])
    assert _first_command(pipeline) == "evalsha"
