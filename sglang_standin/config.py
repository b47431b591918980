"""Settings of one stand-in server, as one frozen value.

Everything the server and the pure output functions need is here, so a test
can build the same `StandinConfig` the server was started with and compute the
exact outputs it will answer (`outputs.generate_output`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Fault kinds, in the fixed order their shares are laid out on [0, 1).
#: Changing this order changes which prompts get which fault.
FAULT_NAMES: tuple[str, ...] = (
    "missing_think_end",
    "double_think_end",
    "echo_prompt",
    "empty_reasoning",
    "empty_answer",
    "truncate",
    "abort",
    "count_mismatch",
    "http500_first",
    "queue_full_first",
    "slow",
    "bad_output",
    "trickle",
)

#: Kinds of the bad-output fault, in the fixed order a hit prompt's kind is
#: drawn from (see `bad_outputs.bad_output_kind`). Changing it changes kinds.
BAD_OUTPUT_KINDS: tuple[str, ...] = (
    "negative",
    "null",
    "bool",
    "float",
    "string",
    "huge_id",
    "beyond_vocab",
    "meta_types",
    "not_json",
    "huge_body",
)

DEFAULT_MODEL_PATH = "deepseek-ai/DeepSeek-R1"
#: DeepSeek-V3/R1 vocabulary size; the default `vocab_size` is at least this.
DEEPSEEK_VOCAB_SIZE = 129280
#: The batch limit when `--max-running-requests` is not given. Real SGLang derives it from the
#: memory left for the KV cache (2,048 for the tiny CPU model of tests/real_sglang.py); the
#: stand-in has no memory to measure, so it takes this fixed value.
DERIVED_MAX_RUNNING_REQUESTS = 64
#: What an input id outside the vocabulary does: `crash`, as SGLang 0.5.23 (its embedding's
#: IndexError kills the scheduler and every process exits, the request's connection dropped
#: with no answer), or `reject`, a 400 no SGLang release answers (kept for tests of a client
#: against a server that checks ids).
OOV_BEHAVIOURS: tuple[str, ...] = ("crash", "reject")


@dataclass(frozen=True)
class StandinConfig:
    """Every option of the stand-in (CLI flag `--x-y` sets field `x_y`).

    `tokenizer_path`, `served_model_name` and `vocab_size` may be left None;
    they are resolved in `__post_init__` the way SGLang resolves them
    (tokenizer and served name default to the model path; the vocabulary is
    the tokenizer's length when `tokenizer_path` is a local folder with a
    `tokenizer.json`, see `sglang_standin.tokenizer`).

    `context_length`, `max_running_requests` and `max_total_tokens` are
    SGLang's server arguments: None unless given on the command line, and
    reported so in `/server_info`. The limits the server then applies are
    `context_len` (else `model_context_length`, what the pretend checkpoint
    declares), `max_running` and `max_total_num_tokens`.
    """

    # --- server identity and limits
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = DEFAULT_MODEL_PATH
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    weight_version: str = "default"  # SGLang's --weight-version: in /model_info, /server_info and each answer
    api_key: str | None = None
    context_length: int | None = None
    model_context_length: int = 32768
    allow_auto_truncate: bool = False
    reasoning_parser: str | None = None
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_total_tokens: int | None = None
    vocab_size: int | None = None
    oov_ids: str = "crash"  # one of OOV_BEHAVIOURS
    enable_metrics: bool = False
    # --- behaviours of other SGLang releases than 0.5.23 (off: as 0.5.23)
    meta_info_load: bool = False  # 2026 main: num_running_reqs / num_waiting_reqs in meta_info
    serve_get_load: bool = False  # older releases: the deprecated GET /get_load
    # --- lifecycle
    load_seconds: float = 0.0
    warmup_seconds: float = 0.0
    health_latency: float = 1.0
    access_log: bool = False
    log_level: str = "info"
    timeout_keep_alive: float = 5.0  # uvicorn's (and so SGLang's) idle keep-alive timeout
    ssl_certfile: str | None = None  # HTTPS with this certificate chain (and --ssl-keyfile)
    ssl_keyfile: str | None = None
    # --- continuous-batching time model (all zero = instant answers)
    step_base: float = 0.002
    step_per_request: float = 0.00002
    prefill_per_token: float = 0.0000005  # per prompt token not found in the prefix cache
    prefix_cache_tokens: int = 1 << 20  # radix prefix cache bound in tokens; 0 disables it
    # --- deterministic outputs
    seed: int = 0
    output_len_median: float = 160.0
    output_len_sigma: float = 0.6
    output_len_max: int = 2048
    vocab_low: int = 100
    vocab_high: int = 100000
    think_start_id: int = 128821
    think_end_id: int = 128822
    eos_id: int = 1
    emit_think_start: bool = False
    # a request's sampling_seed varies its answer (length, tokens, planted faults: `for_seed`), as a
    # real model's samples of one prompt differ; off, the answer is the prompt's alone
    seeded_outputs: bool = False
    # --- faults: shares in [0, 1], laid out in FAULT_NAMES order
    fault_missing_think_end: float = 0.0
    fault_double_think_end: float = 0.0
    fault_echo_prompt: float = 0.0
    fault_empty_reasoning: float = 0.0
    fault_empty_answer: float = 0.0
    fault_truncate: float = 0.0
    fault_abort: float = 0.0
    fault_count_mismatch: float = 0.0
    fault_http500_first: float = 0.0
    fault_queue_full_first: float = 0.0
    fault_slow: float = 0.0
    fault_bad_output: float = 0.0
    fault_trickle: float = 0.0
    fault_truncate_tokens: int = 512
    slow_seconds: float = 30.0
    bad_output_kinds: tuple[str, ...] = BAD_OUTPUT_KINDS  # a "a,b" string is accepted too
    huge_body_ids: int = 3_000_000
    trickle_seconds: float = 10.0
    # --- the wedge: the engine hangs, the HTTP front answers (see wedge.py); switchable at run time
    wedge: bool = False
    wedge_trickle_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.tokenizer_path is None:
            object.__setattr__(self, "tokenizer_path", self.model_path)
        if self.served_model_name is None:
            object.__setattr__(self, "served_model_name", self.model_path)
        if self.vocab_size is None:
            from sglang_standin.tokenizer import load_tokenizer  # a local folder's tokenizer.json

            found = load_tokenizer(self.tokenizer_path)
            needed = max(self.special_ids) + 1
            object.__setattr__(self, "vocab_size", found.vocab_size if found is not None
                               else max(DEEPSEEK_VOCAB_SIZE, needed, self.vocab_high))
        if isinstance(self.bad_output_kinds, str):
            kinds = tuple(k.strip() for k in self.bad_output_kinds.split(",") if k.strip())
            object.__setattr__(self, "bad_output_kinds", kinds)
        elif not isinstance(self.bad_output_kinds, tuple):
            object.__setattr__(self, "bad_output_kinds", tuple(self.bad_output_kinds))
        _validate(self)

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids that content tokens must never take (they carry structure)."""
        return frozenset((self.think_start_id, self.think_end_id, self.eos_id))

    @property
    def instant(self) -> bool:
        """True when no time is modelled: answers come back immediately."""
        return self.step_base == 0 and self.step_per_request == 0 and self.prefill_per_token == 0

    @property
    def enabled_bad_output_kinds(self) -> tuple[str, ...]:
        """The enabled bad-output kinds in BAD_OUTPUT_KINDS order (not CLI order)."""
        return tuple(k for k in BAD_OUTPUT_KINDS if k in self.bad_output_kinds)

    @property
    def context_len(self) -> int:
        """The context length in force: `--context-length`, else the model's."""
        return self.context_length or self.model_context_length

    @property
    def max_running(self) -> int:
        """The batch limit in force: `--max-running-requests`, else the derived one."""
        return self.max_running_requests or DERIVED_MAX_RUNNING_REQUESTS

    @property
    def max_total_num_tokens(self) -> int:
        """The modelled KV-cache capacity in tokens (reported by info and load routes):
        `--max-total-tokens`, else a full context for each batch slot."""
        return self.max_total_tokens or self.context_len * self.max_running

    @property
    def max_req_len(self) -> int:
        """SGLang's scheduler's `max_req_len`: prompt and output together stay below it."""
        return min(self.context_len - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """The scheduler refuses a prompt of this many tokens or more (`max_req_len - 5`)."""
        return self.max_req_len - 5

    def fault_share(self, name: str) -> float:
        """The share of prompts given fault `name` (one of FAULT_NAMES)."""
        return float(getattr(self, f"fault_{name}"))


def _validate(cfg: StandinConfig) -> None:
    """Reject settings that would make the stand-in hang or lie."""
    _check(cfg.context_length is None or cfg.context_length >= 8, "context_length must be at least 8")
    _check(cfg.model_context_length >= 8, "model_context_length must be at least 8")
    _check(cfg.max_running_requests is None or cfg.max_running_requests >= 1,
           "max_running_requests must be at least 1")
    _check(cfg.max_total_tokens is None or cfg.max_total_tokens >= 8, "max_total_tokens must be at least 8")
    _check(cfg.oov_ids in OOV_BEHAVIOURS, f"oov_ids must be one of {', '.join(OOV_BEHAVIOURS)}")
    _check(cfg.prefix_cache_tokens >= 0, "prefix_cache_tokens must be >= 0")
    _check(
        cfg.max_queued_requests is None or cfg.max_queued_requests >= 0,
        "max_queued_requests must be >= 0",
    )
    for name in ("load_seconds", "warmup_seconds", "health_latency", "step_base",
                 "step_per_request", "prefill_per_token", "slow_seconds", "trickle_seconds",
                 "wedge_trickle_seconds"):
        value = getattr(cfg, name)
        _check(math.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0")
    _check(cfg.output_len_median > 0, "output_len_median must be > 0")
    _check(cfg.output_len_sigma >= 0, "output_len_sigma must be >= 0")
    _check(cfg.output_len_max >= 4, "output_len_max must be at least 4")
    _check(cfg.fault_truncate_tokens >= 4, "fault_truncate_tokens must be at least 4")
    _check(cfg.huge_body_ids >= 1, "huge_body_ids must be at least 1")
    unknown = sorted(set(cfg.bad_output_kinds) - set(BAD_OUTPUT_KINDS))
    _check(not unknown, f"unknown bad output kinds {unknown}; known: {', '.join(BAD_OUTPUT_KINDS)}")
    _check(len(cfg.bad_output_kinds) >= 1, "bad_output_kinds must name at least one kind")
    usable = cfg.vocab_high - cfg.vocab_low - sum(
        1 for i in cfg.special_ids if cfg.vocab_low <= i < cfg.vocab_high
    )
    _check(cfg.vocab_low >= 0 and usable >= 1, "vocab range must hold a non-special id")
    _check(len(cfg.special_ids) == 3, "think_start_id, think_end_id and eos_id must differ")
    _check(cfg.vocab_size > max(cfg.special_ids), "vocab_size must exceed every special id")
    shares = [cfg.fault_share(n) for n in FAULT_NAMES]
    _check(all(0.0 <= s <= 1.0 for s in shares), "fault shares must lie in [0, 1]")
    _check(sum(shares) <= 1.0 + 1e-9, "fault shares must add up to at most 1")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
