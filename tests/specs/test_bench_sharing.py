"""The bench's shared-server rows: topologies with several workers or a gateway, and how their goals are judged.

Given the numbers a run measured, when the bench makes its rows, then each
goal sits beside its figure and is met or not as the issue words it: the
queue's median at most a quarter of the batch, each worker's share within 20%
of the others', and the CPU-bound signal firing exactly where short answers
fell short.
"""
from __future__ import annotations

import pytest

from bench.saturation import Topology
from bench.shared_server import share_spread, sharing_figures, steady_waiting_median


@pytest.mark.parametrize("text, batches, profile, workers, gateway", [
    ("2x64", (64, 64), "long", None, False),
    ("1x64/w3", (64,), "long", 3, False),
    ("gw:2x64/w4", (64, 64), "long", 4, True),
    ("1x256:short/w2", (256,), "short", 2, False),
    ("64+256:short", (64, 256), "short", None, False),
])
def test_a_topology_names_its_servers_workers_and_gateway(text, batches, profile, workers, gateway):
    topo = Topology.parse(text)
    assert (topo.batches, topo.profile, topo.workers, topo.gateway, topo.name) == (batches, profile, workers,
                                                                                   gateway, text)
    # the ideal client depends on the servers and the prompts only
    assert topo.servers_key == (batches, profile)


def test_the_queue_median_is_taken_over_the_middle_of_the_busy_samples():
    idle, flood, steady, drain = [(0, 0)] * 5, [(64, 200)] * 2, [(64, 6)] * 8, [(30, 0)] * 2
    assert steady_waiting_median(idle + flood + steady + drain + idle) == 6
    assert steady_waiting_median(idle) is None


def test_shares_are_the_smallest_over_the_largest():
    assert share_spread({"a": 110, "b": 103, "c": 107}) == pytest.approx(103 / 110)
    assert share_spread({"a": 0}) is None


def result(profile: str, ratio: float, workers: int, fired: list[str], rows: dict | None = None,
           medians: list | None = None, batches: tuple = (64,)) -> dict:
    return {"topology": {"batches": batches, "profile": profile}, "ratio": ratio,
            "fleet": {"workers": workers, "cpu_bound_workers": fired, "cpu_share_max": 0.9,
                      "worker_rows": rows or {}, "waiting_median": medians or []}}


def judged(figures) -> dict[str, bool | None]:
    return {f.name: f.met for f in figures}


def test_three_workers_sharing_fairly_with_a_short_queue_meet_their_goals():
    figures = sharing_figures(result("long", 0.99, 3, [], {"a": 110, "b": 103, "c": 107}, [7]), "p", 0.97)
    assert judged(figures) == {"waiting queue, median / (batch / 4), worst server": True,
                               "finished share, smallest / largest worker": True,
                               "workers that said CPU-bound": True}


def test_a_long_queue_and_a_starved_worker_do_not():
    figures = sharing_figures(result("long", 0.99, 2, [], {"a": 100, "b": 70}, [17]), "p", 0.97)
    assert judged(figures)["waiting queue, median / (batch / 4), worst server"] is False  # 17 > 64 / 4
    assert judged(figures)["finished share, smallest / largest worker"] is False  # 0.7 < 0.8


@pytest.mark.parametrize("profile, ratio, fired, met", [
    ("short", 0.66, ["w0"], True),    # one process fell short and said so
    ("short", 0.66, [], False),       # fell short and said nothing
    ("short", 0.98, [], True),        # two processes kept up, quiet
    ("short", 0.98, ["w0"], False),   # kept up but cried wolf
    ("long", 0.90, [], True),         # long answers never make a worker CPU-bound
])
def test_the_cpu_bound_signal_should_fire_exactly_where_short_answers_fell_short(profile, ratio, fired, met):
    figures = sharing_figures(result(profile, ratio, 1, fired), "p", 0.97)
    assert judged(figures)["workers that said CPU-bound"] is met
