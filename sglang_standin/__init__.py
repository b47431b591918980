"""A stand-in for SGLang's native HTTP server, for tests, the demo and benchmarks.

It answers `/generate` with pre-tokenized `input_ids` exactly as real SGLang
does (response shape, finish reasons, error bodies, health semantics), with
deterministic per-prompt outputs (`sglang_standin.outputs`), a continuous-
batching time model and deterministic fault injection. Nothing in `workers/`
imports it; tests import `outputs` to know the exact expected tokens.

Run it with `python -m sglang_standin --port 30000 [options]` (see --help).

Faults are shares of prompts (`--fault-NAME SHARE`, names in FAULT_NAMES),
decided per prompt, so a test can predict them: `outputs.fault_for(ids, cfg)`
draws u = Random(sha256(b"sglang-standin/fault/" + seed as 16-byte signed
little-endian + ids as uint32 little-endian)).random() and fault i owns
[sum of earlier shares, + its share). Delivery faults, non-streaming only:

- `--fault-bad-output S [--bad-output-kinds a,b] [--huge-body-ids N]`: a 200
  a correct client must refuse; the kind per prompt is
  `bad_outputs.bad_output_kind(ids, cfg)` (same hash, purpose
  b"bad-output-kind"). /standin/stats `bad_outputs` maps each prompt key
  (rid, else sha256 of the ids) to the kinds it was sent.
- `--fault-trickle S --trickle-seconds T`: the body is sent a few bytes at a
  time over T seconds; /standin/stats `trickled` counts them per key.

The whole server can wedge (`--wedge`, or at run time `POST /standin/wedge
{"wedged": true|false}`): the engine hangs while the port answers; /health
sends 200's head and then a byte every `--wedge-trickle-seconds`,
/generate and the scheduler's routes answer nothing until it heals (see
`wedge`); /standin/stats `wedged` counts the requests it held, per key.

Load as SGLang reports it: `/v1/loads`, `/get_load`, `num_running_reqs` and
`num_waiting_reqs` in meta_info (see `routes_load`). `--api-key` guards every
route but /health* and /metrics* (see `auth`).

Prefix cache (`prefix_cache`), as SGLang's radix cache: `--prefix-cache-tokens N`
bounds it (least recently used leaves evicted; 0 or `--disable-radix-cache`
turns it off); a prompt is cached after its prefill step, prompt and output
(all but the last token) when it finishes. Every answer's
`meta_info.cached_tokens` is the prompt's hit when it was scheduled, and
`--prefill-per-token` is charged for the other prompt tokens only. `/metrics`
(`metrics`) serves `sglang:prompt_tokens_total`, `sglang:cached_tokens_total`,
`sglang:num_running_reqs` and `sglang:num_queue_reqs`, labelled `model_name`.
"""

from sglang_standin.config import FAULT_NAMES, StandinConfig

__all__ = ["FAULT_NAMES", "StandinConfig"]
