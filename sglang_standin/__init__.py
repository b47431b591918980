"""A stand-in for SGLang's native HTTP server, for tests, the demo and benchmarks.

It answers `/generate` with pre-tokenized `input_ids` exactly as SGLang 0.5.23
does (response shape, finish reasons, error bodies, limits, health
semantics), with deterministic per-prompt outputs (`sglang_standin.outputs`),
a continuous-batching time model and deterministic fault injection. Nothing
in `workers/` imports it; tests import `outputs` to know the exact expected
tokens. tests/real/test_standin_contract.py asks the real server and the
stand-in the same questions and fails on any difference the fleet reads; so
where they differed, the stand-in follows the real server: an id outside the
vocabulary ends the server with no answer (`--oov-ids reject` for a 400
instead), an unknown sampling key is the contract gate's 400 (`contract_gate`),
the longest prompt is `max_req_input_len` - 1 (`request_model`), `/server_info`
reports only the limits given on the command line, `/metrics` needs
`--enable-metrics`, and `--tokenizer-path` (a local folder) gives it a
tokenizer for `text` input and `/tokenize` (`tokenizer`).

Log-probabilities (`return_logprob`, `top_logprobs_num`, `logprob_start_len`)
come in `meta_info` with SGLang 0.5.23's keys, order and shapes, the produced
token the most likely of its top list (`logprobs`). /standin/stats `asked`
keeps, per key, what its last request asked besides its ids (`sampling_params`
and those fields): a test sees the sampling a client really sent.

Run it with `python -m sglang_standin --port 30000 [options]` (see --help).

An answer is the prompt's alone by default, whatever the request's
`sampling_seed` (which /standin/stats `seeds` records per key); with
`--seeded-outputs` it is drawn with that seed mixed in (`outputs.for_seed`),
so the samples of one prompt differ, as a real model's do at a temperature
above 0.

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

Load as SGLang 0.5.23 reports it: `/v1/loads` (see `routes_load`). Other
releases' reports only when asked for: `--serve-get-load` (the deprecated
`/get_load` of older ones) and `--meta-info-load` (`num_running_reqs` and
`num_waiting_reqs` in every answer's meta_info, 2026 main builds). `--api-key`
guards every route but /health* and /metrics* (see `auth`); `POST /standin/api-key
{"api_key": "NEW"}` rotates it in place, as a restart with a new key would but unseen by
health checks.

Prefix cache (`prefix_cache`), as SGLang's radix cache: `--prefix-cache-tokens N`
bounds it (least recently used leaves evicted; 0 or `--disable-radix-cache`
turns it off); a prompt is cached after its prefill step, prompt and output
(all but the last token) when it finishes. Every answer's
`meta_info.cached_tokens` is the prompt's hit when it was scheduled, and
`--prefill-per-token` is charged for the other prompt tokens only. With
`--enable-metrics`, `/metrics` (`metrics`) serves `sglang:prompt_tokens_total`, `sglang:cached_tokens_total`,
`sglang:num_running_reqs` and `sglang:num_queue_reqs`, labelled `model_name`.
"""

from sglang_standin.config import FAULT_NAMES, StandinConfig

__all__ = ["FAULT_NAMES", "StandinConfig"]
