"""Command line of `python -m sglang_standin`.

Flag names follow `sglang.launch_server` where SGLang has the same knob
(`--model-path`, `--context-length`, `--max-running-requests`, ...), so a
compose file or script can switch between the real server and the stand-in by
changing only the module name.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from sglang_standin.config import FAULT_NAMES, StandinConfig

_D = StandinConfig()  # the dataclass is the single source of defaults


def build_parser() -> argparse.ArgumentParser:
    """Parser whose destinations are exactly StandinConfig field names."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_standin",
        description="A fake SGLang server (native /generate API) for tests and benchmarks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _server_options(p.add_argument_group("server"))
    _lifecycle_options(p.add_argument_group("lifecycle"))
    _timing_options(p.add_argument_group("continuous-batching time model"))
    _output_options(p.add_argument_group("deterministic outputs"))
    _fault_options(p.add_argument_group("faults (shares of prompts, deterministic by prompt)"))
    return p


def _server_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host", default=_D.host)
    g.add_argument("--port", type=int, default=_D.port, help="0 picks a free port")
    g.add_argument("--model-path", default=_D.model_path)
    g.add_argument("--tokenizer-path", default=None, help="default: the model path")
    g.add_argument("--served-model-name", default=None, help="default: the model path")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    g.add_argument("--context-length", type=int, default=_D.context_length)
    g.add_argument("--allow-auto-truncate", action="store_true",
                   help="cut over-long inputs instead of answering 400")
    g.add_argument("--reasoning-parser", default=None,
                   help="only reported, and makes meta_info.reasoning_tokens count")
    g.add_argument("--max-running-requests", type=int, default=_D.max_running_requests)
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="503 queue-full beyond this many waiting requests (default unbounded)")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="input ids must be below this (default: max(129280, special ids + 1))")


def _lifecycle_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--load-seconds", type=float, default=_D.load_seconds,
                   help="sleep before binding the port (connection refused meanwhile)")
    g.add_argument("--warmup-seconds", type=float, default=_D.warmup_seconds,
                   help="health answers 503 for this long after binding")
    g.add_argument("--health-latency", type=float, default=_D.health_latency,
                   help="seconds a healthy /health takes (real SGLang: about 1)")
    g.add_argument("--access-log", action="store_true", help="turn on uvicorn's access log")
    g.add_argument("--log-level", default=_D.log_level)


def _timing_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--step-base", type=float, default=_D.step_base,
                   help="seconds per decode step")
    g.add_argument("--step-per-request", type=float, default=_D.step_per_request,
                   help="extra seconds per decode step per running request")
    g.add_argument("--prefill-per-token", type=float, default=_D.prefill_per_token,
                   help="seconds per prompt token, paid once on admission")


def _output_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--seed", type=int, default=_D.seed)
    g.add_argument("--output-len-median", type=float, default=_D.output_len_median)
    g.add_argument("--output-len-sigma", type=float, default=_D.output_len_sigma)
    g.add_argument("--output-len-max", type=int, default=_D.output_len_max)
    g.add_argument("--vocab-low", type=int, default=_D.vocab_low)
    g.add_argument("--vocab-high", type=int, default=_D.vocab_high)
    g.add_argument("--think-start-id", type=int, default=_D.think_start_id)
    g.add_argument("--think-end-id", type=int, default=_D.think_end_id)
    g.add_argument("--eos-id", type=int, default=_D.eos_id)
    g.add_argument("--emit-think-start", action="store_true",
                   help="outputs begin with think-start (template leaves it to the model)")


def _fault_options(g: argparse._ArgumentGroup) -> None:
    for name in FAULT_NAMES:
        flag = "--fault-" + name.replace("_", "-")
        g.add_argument(flag, dest=f"fault_{name}", type=float, default=0.0, metavar="SHARE")
    g.add_argument("--fault-truncate-tokens", type=int, default=_D.fault_truncate_tokens,
                   help="natural length of prompts with the truncate fault")
    g.add_argument("--slow-seconds", type=float, default=_D.slow_seconds,
                   help="extra seconds a prompt with the slow fault takes")


def parse_config(argv: Sequence[str] | None = None) -> StandinConfig:
    """Parse argv into a validated StandinConfig (argparse error on bad values)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return StandinConfig(**vars(ns))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
