"""What one stored sample costs Redis and the worker, in the regime where the worker is the limit.

One real `celery -A workers worker` (every fleet setting at its default)
drains a queue of short answers (~100 tokens) from one batch-256 stand-in
with the saturation bench's time model (`1x256:short`): hundreds of samples a
second, where the fleet's own cost per sample weighs most. The prompts are
all queued before the worker starts, so the producer's commands are not
counted; the worker then warms up (imports, threads, its servers' capacity
tuned), and the figures are taken over a steady window in the middle of the
run, from `--sample-warmup` samples stored until `--sample-tail` remain: the
queue is full at both ends, so the prompts in flight at the start and at the
end of the window balance out, and every figure is a difference divided by
the samples stored in between.

Per stored sample:
- Redis commands, by name, from `INFO commandstats` (a script's own commands
  are counted beside its EVALSHA, as Redis counts them); the bench's own
  polling of the run's counts (one HGETALL per poll) and its INFO reads are
  taken out;
- Redis CPU, from `INFO cpu` (used_cpu_sys + used_cpu_user of redis-server:
  every thread of it), and the bytes it read from clients (`INFO stats`,
  total_net_input_bytes);
- the worker process's CPU (user + sys of its process tree, from /proc).

CPU seconds per sample hold on a shared machine where throughput does not:
a busy neighbour slows the run but does not make a sample cost more CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .lab import Lab
from .procs import _TICKS, tree_cpu_seconds
from .prompts import repeated, write_jsonl
from .publish import enqueue
from .saturation import PROFILES

POLLS_PER_S = 20  # how often the window's ends are looked for (one HGETALL each)


@dataclass
class SampleOptions:
    prompts: int = 6000
    warmup: int = 1500           # samples stored before the window opens
    tail: int = 1000             # samples left queued when it closes
    batch: int = 256
    step_base: float = 0.004     # the saturation bench's time model
    step_per_request: float = 0.00002
    max_new_tokens: int = 8192
    timeout: float = 900.0

    def standin_options(self) -> list[str]:
        p = PROFILES["short"]
        return ["--max-running-requests", str(self.batch), "--output-len-median", str(p.median),
                "--output-len-sigma", str(p.sigma), "--output-len-max", str(p.maximum),
                "--step-base", str(self.step_base), "--step-per-request", str(self.step_per_request)]


def run_sample_cost(lab: Lab, opts: SampleOptions, log) -> dict:
    if opts.warmup + opts.tail >= opts.prompts:
        raise ValueError("--sample-prompts must exceed --sample-warmup + --sample-tail")
    lab.flush()
    run = "sample-cost"
    prompts = write_jsonl(lab.root / "prompts" / f"sample-{opts.prompts}.jsonl", repeated(opts.prompts))
    standin = lab.standins(1, opts.standin_options())[0]
    worker = None
    try:
        log(f"sample cost: {opts.prompts} prompts queued, then one worker on a batch-{opts.batch} stand-in")
        enqueue(prompts, run, opts.max_new_tokens)
        worker = lab.worker("sample", {"SGLANG_URLS": standin.url,
                                       "OUTPUT_DIR": str(lab.output_dir("sample"))})
        watch = [worker, standin.process]
        start = _reading(lab, worker.popen.pid, _wait_done(lab, run, opts.warmup, watch, opts))
        end = _reading(lab, worker.popen.pid, _wait_done(lab, run, opts.prompts - opts.tail, watch, opts))
        states = lab.wait_finished(run, opts.prompts, opts.timeout, watch)
    finally:
        lab.stop(([worker] if worker else []) + [standin.process])
    return _per_sample(start, end, states)


def _wait_done(lab: Lab, run: str, count: int, watch, opts: SampleOptions) -> tuple[int, int]:
    """Poll the run's counts until `count` are done; returns (done, polls made)."""
    deadline, polls = time.monotonic() + opts.timeout, 0
    while True:
        done = lab.run_states(run).get("done", 0)
        polls += 1
        if done >= count:
            return done, polls
        if time.monotonic() > deadline or any(not p.alive() for p in watch):
            raise RuntimeError(f"run {run}: {done} of {count} samples stored; "
                               + "; ".join(f"{p.name}: {p.tail(20)}" for p in watch))
        time.sleep(1 / POLLS_PER_S)


def _reading(lab: Lab, pid: int, progress: tuple[int, int]) -> dict:
    info = lab.client.info("all")
    done, polls = progress
    return {
        "time": time.monotonic(), "done": done, "polls": polls,
        "worker_cpu_s": tree_cpu_seconds(pid), "worker_sys_s": _sys_seconds(pid),
        "redis_cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "net_in": int(info["total_net_input_bytes"]), "net_out": int(info["total_net_output_bytes"]),
        "commands": {k[len("cmdstat_"):]: int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")},
        "usec": {k[len("cmdstat_"):]: int(v["usec"]) for k, v in info.items() if k.startswith("cmdstat_")},
    }


def _sys_seconds(pid: int) -> float:
    """The kernel's share of a process's CPU (/proc/<pid>/stat stime): thread switches and I/O."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        raw = handle.read().decode()
    return int(raw[raw.rindex(")") + 2:].split()[12]) / _TICKS


def _per_sample(start: dict, end: dict, states: dict) -> dict:
    samples = end["done"] - start["done"]
    calls = {name: n - start["commands"].get(name, 0) for name, n in end["commands"].items()}
    calls["hgetall"] = calls.get("hgetall", 0) - end["polls"]  # the bench's own polls
    calls["info"] = calls.get("info", 0) - 1  # the reading at the window's end
    per = {name: n / samples for name, n in sorted(calls.items(), key=lambda kv: -kv[1]) if n > 0}
    usec = {name: (n - start.get("usec", {}).get(name, 0)) / samples for name, n in end.get("usec", {}).items()}
    wall = end["time"] - start["time"]
    return {
        "samples": samples, "wall_s": wall, "samples_per_s": samples / wall, "states": states,
        "commands_per_sample": sum(per.values()), "commands": per,
        # Redis's own time in each command, per sample (a script's includes the commands it calls)
        "command_us": {name: round(us, 2) for name, us in sorted(usec.items(), key=lambda kv: -kv[1]) if us > 0},
        "redis_cpu_us_per_sample": (end["redis_cpu_s"] - start["redis_cpu_s"]) / samples * 1e6,
        "redis_in_bytes_per_sample": (end["net_in"] - start["net_in"]) / samples,
        "redis_out_bytes_per_sample": (end["net_out"] - start["net_out"]) / samples,
        "worker_cpu_us_per_sample": (end["worker_cpu_s"] - start["worker_cpu_s"]) / samples * 1e6,
        "worker_cpu_share": (end["worker_cpu_s"] - start["worker_cpu_s"]) / wall,
        "worker_sys_share": (end["worker_sys_s"] - start["worker_sys_s"]) / max(
            end["worker_cpu_s"] - start["worker_cpu_s"], 1e-9),
    }


def sample_figures(d: dict) -> list:
    from .report import Figure, at_most

    part = "9 cost per sample"
    top = ", ".join(f"{name} {n:.2f}" for name, n in list(d["commands"].items())[:12])
    window = f"{d['samples']} samples over {d['wall_s']:.0f} s ({d['samples_per_s']:.0f}/s)"
    return [
        Figure(part, "Redis commands per stored sample", d["commands_per_sample"], "{:.1f}", goal="<= 9",
               met=at_most(d["commands_per_sample"], 9.0), note=f"{top}; {window}"),
        Figure(part, "Redis CPU per stored sample", d["redis_cpu_us_per_sample"], "{:.0f}", "us", goal="<= 150",
               met=at_most(d["redis_cpu_us_per_sample"], 150.0),
               note=f"used_cpu_sys+user; {d['redis_in_bytes_per_sample']:,.0f} B in, "
                    f"{d['redis_out_bytes_per_sample']:,.0f} B out per sample"),
        Figure(part, "worker CPU per stored sample", d["worker_cpu_us_per_sample"], "{:,.0f}", "us",
               note=f"one worker process, batch-256 stand-in, ~100-token answers; "
                    f"{d['worker_cpu_share']:.2f} of a core, {d['worker_sys_share']:.0%} of it in the kernel"),
    ]
