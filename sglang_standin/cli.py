"""Command line of `python -m sglang_standin`.

Flag names follow `sglang.launch_server` where SGLang has the same knob
(`--model-path`, `--context-length`, `--max-running-requests`, ...), so a
compose file or script can switch between the real server and the stand-in by
changing only the module name.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from sglang_standin.config import (BAD_OUTPUT_KINDS, DERIVED_MAX_RUNNING_REQUESTS, FAULT_NAMES, OOV_BEHAVIOURS,
                                   StandinConfig)

_D = StandinConfig()  # the dataclass is the single source of defaults

#: Help for the fault shares that need more than their name (see the package docstring).
_FAULT_HELP: dict[str, str] = {
    "bad_output": "share of prompts answered 200 with a body a correct client must refuse "
                  "(kind per prompt from --bad-output-kinds); non-streaming answers only",
    "trickle": "share of prompts whose answer body is sent a few bytes at a time over "
               "--trickle-seconds (a per-read timeout never fires); non-streaming answers only",
}


def build_parser() -> argparse.ArgumentParser:
    """Parser whose destinations are exactly StandinConfig field names."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_standin",
        description="A fake SGLang server (native /generate API) for tests and benchmarks. It answers "
                    "as SGLang 0.5.23 does (tests/real/test_standin_contract.py asks both); the options "
                    "under 'other SGLang releases' turn on what other releases do instead.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _server_options(p.add_argument_group("server"))
    _lifecycle_options(p.add_argument_group("lifecycle"))
    _release_options(p.add_argument_group("other SGLang releases (not 0.5.23's behaviour)"))
    _timing_options(p.add_argument_group("continuous-batching time model"))
    _output_options(p.add_argument_group("deterministic outputs"))
    _fault_options(p.add_argument_group("faults (shares of prompts, deterministic by prompt)"))
    return p


def _server_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host", default=_D.host)
    g.add_argument("--port", type=int, default=_D.port, help="0 picks a free port")
    g.add_argument("--model-path", default=_D.model_path)
    g.add_argument("--tokenizer-path", default=None,
                   help="default: the model path. A local folder with a tokenizer.json gives the stand-in "
                        "a tokenizer: text input, POST /tokenize, and the vocabulary size")
    g.add_argument("--served-model-name", default=None, help="default: the model path")
    g.add_argument("--weight-version", default=_D.weight_version,
                   help="the weights' version, as SGLang's --weight-version: reported by /model_info, "
                        "/server_info and each answer's meta_info")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health* and "
                        "/metrics* (as SGLang); 401 {\"error\": \"Unauthorized\"} otherwise. "
                        "POST /standin/api-key {\"api_key\": \"NEW\"} rotates it at run time")
    g.add_argument("--context-length", type=int, default=None,
                   help="overrides the model's (--model-context-length); /server_info reports it, null "
                        "when not given, as SGLang")
    g.add_argument("--model-context-length", type=int, default=_D.model_context_length,
                   help="the context length the pretend checkpoint declares (real SGLang reads it from "
                        "config.json); /v1/models' max_model_len")
    g.add_argument("--allow-auto-truncate", action="store_true",
                   help="cut over-long inputs instead of answering 400")
    g.add_argument("--reasoning-parser", default=None,
                   help="only reported, and makes meta_info.reasoning_tokens count")
    g.add_argument("--max-running-requests", type=int, default=None,
                   help="the batch limit, reported in /server_info; not given, the limit is %d (SGLang "
                        "derives one from memory) and /server_info reports null" % DERIVED_MAX_RUNNING_REQUESTS)
    g.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV-cache size in tokens; not given, a full context per batch slot. With the "
                        "context it sets max_req_input_len, min(context - 1, this - 1) - 5")
    g.add_argument("--max-queued-requests", type=int, default=None,
                   help="503 queue-full beyond this many waiting requests (default unbounded)")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="input ids must lie in [0, this) (see --oov-ids), and the beyond_vocab bad output is "
                        "this id (default: the tokenizer's length, else max(129280, special ids + 1, "
                        "--vocab-high))")
    g.add_argument("--oov-ids", choices=OOV_BEHAVIOURS, default=_D.oov_ids,
                   help="an input id outside the vocabulary: 'crash' as SGLang 0.5.23 (the connection drops "
                        "with no answer and the server exits), or 'reject' with a 400 (no SGLang release "
                        "does that)")
    g.add_argument("--enable-metrics", action="store_true",
                   help="serve GET /metrics (404 without it, as SGLang)")


def _release_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--meta-info-load", action="store_true",
                   help="copy the scheduler's num_running_reqs / num_waiting_reqs into every answer's "
                        "meta_info, as 2026 main builds do (0.5.23 does not)")
    g.add_argument("--serve-get-load", action="store_true",
                   help="serve the deprecated GET /get_load of older releases (0.5.23 answers 404)")


def _lifecycle_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--load-seconds", type=float, default=_D.load_seconds,
                   help="sleep before binding the port (connection refused meanwhile)")
    g.add_argument("--warmup-seconds", type=float, default=_D.warmup_seconds,
                   help="health answers 503 for this long after binding")
    g.add_argument("--health-latency", type=float, default=_D.health_latency,
                   help="seconds a healthy /health takes (real SGLang: about 1)")
    g.add_argument("--access-log", action="store_true", help="turn on uvicorn's access log")
    g.add_argument("--log-level", default=_D.log_level)
    g.add_argument("--timeout-keep-alive", type=float, default=_D.timeout_keep_alive,
                   help="seconds an idle keep-alive connection stays open (uvicorn's, so SGLang's: 5)")
    g.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate chain (PEM)")
    g.add_argument("--ssl-keyfile", default=None, help="the private key of --ssl-certfile (PEM)")


def _timing_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--step-base", type=float, default=_D.step_base,
                   help="seconds per decode step")
    g.add_argument("--step-per-request", type=float, default=_D.step_per_request,
                   help="extra seconds per decode step per running request")
    g.add_argument("--prefill-per-token", type=float, default=_D.prefill_per_token,
                   help="seconds per prompt token not in the prefix cache, paid once on admission")
    g.add_argument("--prefix-cache-tokens", type=int, default=_D.prefix_cache_tokens,
                   help="size of the radix prefix cache in tokens (LRU leaves evicted); 0 disables")
    g.add_argument("--disable-radix-cache", dest="prefix_cache_tokens", action="store_const",
                   const=0, default=argparse.SUPPRESS, help="SGLang's flag: the same as 0 above")


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
    g.add_argument("--seeded-outputs", action="store_true",
                   help="a request's sampling_seed varies its answer, as a real model's samples differ")


def _fault_options(g: argparse._ArgumentGroup) -> None:
    for name in FAULT_NAMES:
        flag = "--fault-" + name.replace("_", "-")
        g.add_argument(flag, dest=f"fault_{name}", type=float, default=0.0, metavar="SHARE",
                       help=_FAULT_HELP.get(name))
    g.add_argument("--fault-truncate-tokens", type=int, default=_D.fault_truncate_tokens,
                   help="natural length of prompts with the truncate fault")
    g.add_argument("--slow-seconds", type=float, default=_D.slow_seconds,
                   help="extra seconds a prompt with the slow fault takes")
    g.add_argument("--bad-output-kinds", type=_kinds, default=",".join(_D.bad_output_kinds),
                   metavar="A,B,...",
                   help="bad-output kinds to draw from: " + ", ".join(BAD_OUTPUT_KINDS)
                        + " (negative/null/bool/float/string/huge_id/beyond_vocab: one such "
                        "entry in output_ids; meta_types: completion_tokens a string and "
                        "finish_reason a list; not_json: a cut-off body still labelled "
                        "application/json; huge_body: --huge-body-ids output ids)")
    g.add_argument("--huge-body-ids", type=int, default=_D.huge_body_ids,
                   help="output_ids length of the huge_body bad output (3,000,000 is about 12 MB of JSON)")
    g.add_argument("--trickle-seconds", type=float, default=_D.trickle_seconds,
                   help="seconds over which a trickle-fault answer's body is spread")
    g.add_argument("--wedge", action="store_true",
                   help="start with the engine hung: /health sends 200's head and then a byte every "
                        "--wedge-trickle-seconds, /generate, /server_info and the load routes never answer; "
                        "POST /standin/wedge {\"wedged\": true|false} switches it at run time")
    g.add_argument("--wedge-trickle-seconds", type=float, default=_D.wedge_trickle_seconds,
                   help="seconds between the bytes of a wedged server's /health")


def _kinds(text: str) -> tuple[str, ...]:
    """`a,b,c` -> ("a", "b", "c"), rejecting unknown kinds with argparse's error."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in BAD_OUTPUT_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown kind(s) {unknown or text!r}; choose from {', '.join(BAD_OUTPUT_KINDS)}")
    return kinds


def parse_config(argv: Sequence[str] | None = None) -> StandinConfig:
    """Parse argv into a validated StandinConfig (argparse error on bad values)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return StandinConfig(**vars(ns))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
