"""The fleet-size bench's projection: n nodes cost n times a node's work, plus the audit once.

A node at `rate` samples a second pays `rate` samples, its periodic work per
second, and its task-event flushes (at most one a FLUSH_INTERVAL, fewer when it
stores fewer); the audit runs once per interval for the whole fleet, whatever n.
"""
from __future__ import annotations

from types import SimpleNamespace

from bench.fleet_size import FleetOptions, project
from workers.reporting.events import FLUSH_INTERVAL


def measured(per_sample_us: float, per_worker_s_us: float, event_us: float, audit_ms: float) -> dict:
    return {"samples": {"redis_us_per_sample": per_sample_us, "commands_per_sample": 10.0, "connections": 4},
            "redis_us_per_worker_s": per_worker_s_us, "commands_per_worker_s": 5.0,
            "rounds": {"worker-heartbeat event": {"redis_us": event_us}},
            "audit": {"redis_ms_per_round": audit_ms}}


def test_nodes_cost_their_samples_periodic_work_and_events_and_the_audit_once():
    # Given 100 us a sample, 50 us a worker-second, 30 us an event flush and a 30 ms audit round
    opts = FleetOptions(rate=2.0, nodes=[100, 5000])
    p = project(measured(100.0, 50.0, 30.0, 30.0), opts, SimpleNamespace(audit_interval=30.0))
    # Then a node costs 2 x 100 + 50 + its flushes, and the audit 1 ms a second for all
    flushes = min(1 / FLUSH_INTERVAL, 3 * 2.0)
    assert p["per_node_us_per_s"] == 2 * 100 + 50 + flushes * 30
    assert p["audit_us_per_s"] == 1000.0
    assert p["nodes"][5000]["cores"] == (5000 * p["per_node_us_per_s"] + 1000.0) / 1e6
    # and connections and prompts in flight scale with the nodes
    assert p["nodes"][5000]["connections"] == 20_000 and p["nodes"][100]["in_flight"] == 25_600
