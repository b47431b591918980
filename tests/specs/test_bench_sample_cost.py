"""The bench's cost per stored sample (`bench/sample_cost.py`): differences over a window, the bench's own calls left out."""
from __future__ import annotations

from bench.sample_cost import _per_sample, sample_figures


def _reading(time, done, polls, commands, redis_cpu, worker_cpu, worker_sys=0.0, net_in=0, net_out=0) -> dict:
    return {"time": time, "done": done, "polls": polls, "commands": commands, "redis_cpu_s": redis_cpu,
            "worker_cpu_s": worker_cpu, "worker_sys_s": worker_sys, "net_in": net_in, "net_out": net_out}


def test_each_figure_is_a_difference_over_the_window_per_sample_stored_in_it():
    # Given two readings 1,000 samples apart; between them the bench polled the counts 40 times
    # (one HGETALL each, `polls` of the end's reading) and read INFO once more
    start = _reading(10.0, 1500, 30, {"evalsha": 100, "hget": 400, "info": 1, "hgetall": 30}, 2.0, 50.0, 10.0, 0, 0)
    end = _reading(14.0, 2500, 40, {"evalsha": 1100, "hget": 4400, "info": 2, "hgetall": 70, "brpop": 20},
                   2.11, 52.5, 10.5, 1_600_000, 1_200_000)

    d = _per_sample(start, end, {"done": 6000})

    # Then the commands are the workers' alone, per sample, busiest first
    assert d["commands"] == {"hget": 4.0, "evalsha": 1.0, "brpop": 0.02}
    assert d["commands_per_sample"] == 5.02
    # and Redis's and the worker's CPU, and the bytes in, are per sample stored in the window
    assert round(d["redis_cpu_us_per_sample"]) == 110 and round(d["worker_cpu_us_per_sample"]) == 2500
    assert d["redis_in_bytes_per_sample"] == 1600 and d["samples_per_s"] == 250
    assert round(d["worker_cpu_share"], 3) == 0.625 and d["worker_sys_share"] == 0.2


def test_the_goals_sit_beside_their_figures():
    start = _reading(0.0, 0, 0, {}, 0.0, 0.0)
    end = _reading(1.0, 100, 0, {"hget": 1000}, 0.02, 0.3)
    commands, redis_cpu, worker = sample_figures(_per_sample(start, end, {}))
    assert (commands.value, commands.goal, commands.met) == (10.0, "<= 9", False)
    assert (round(redis_cpu.value), redis_cpu.goal, redis_cpu.met) == (200, "<= 150", False)
    assert worker.goal == "" and worker.met is None
