"""A stand-in for SGLang's native HTTP server, for tests, the demo and benchmarks.

It answers `/generate` with pre-tokenized `input_ids` exactly as real SGLang
does (response shape, finish reasons, error bodies, health semantics), with
deterministic per-prompt outputs (`sglang_standin.outputs`), a continuous-
batching time model and deterministic fault injection. Nothing in `workers/`
imports it; tests import `outputs` to know the exact expected tokens.

Run it with `python -m sglang_standin --port 30000 [options]` (see --help).
"""

from sglang_standin.config import FAULT_NAMES, StandinConfig

__all__ = ["FAULT_NAMES", "StandinConfig"]
