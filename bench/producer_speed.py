"""Producer speed: does publishing cost much more than tokenizing?

The chat template and BPE encoding are work the producer cannot avoid, so
batched `ChatTokenizer.render` on the same conversations is the floor. The
enqueue path adds reading the file, the ledger check, the think-start check,
building Celery messages and publishing them to a real Redis. The figure is
enqueue prompts/s over tokenizer-only prompts/s, measured in alternating
repetitions in one run (the median of the per-repetition ratios), on prompts
of about 300 tokens (the size `research/baselines.md` measured) and, for
reference, on the bundled short examples, where tokenizing is cheapest and
the per-message cost weighs most.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .lab import Lab
from .prompts import long_prompts, repeated, write_jsonl
from .publish import build_spec, chat_tokenizer, enqueue, token_count


@dataclass
class ProducerOptions:
    prompts: int = 5000
    prompt_tokens: int = 300
    reps: int = 2
    max_new_tokens: int = 8192


def tokenize_only(conversations: list[list[dict]], batch: int) -> float:
    """Seconds to render every conversation in batches, as `enqueue_file` batches them."""
    chat = chat_tokenizer()
    started = time.perf_counter()
    for i in range(0, len(conversations), batch):
        chat.render(conversations[i:i + batch])
    return time.perf_counter() - started


def measure(lab: Lab, name: str, prompts: list, opts: ProducerOptions, log) -> dict:
    from producer.enqueue import BATCH

    path = write_jsonl(lab.root / "prompts" / f"producer-{name}-{len(prompts)}.jsonl", prompts)
    conversations = [m for _, m in prompts]
    chat_tokenizer().render(conversations[:BATCH])  # warm the tokenizer and template
    build_spec("warm", opts.max_new_tokens)          # and the run identity (hashed once per command)
    reps = []
    for rep in range(opts.reps):
        log(f"producer speed, {name} prompts: repetition {rep + 1}/{opts.reps}")
        lab.flush()
        tok_s = tokenize_only(conversations, BATCH)
        lab.flush()
        cpu0, started = time.process_time(), time.perf_counter()
        summary = enqueue(path, f"ps-{name}-{rep}", opts.max_new_tokens)
        enq_s, enq_cpu = time.perf_counter() - started, time.process_time() - cpu0
        reps.append({"tokenize_prompts_per_s": len(prompts) / tok_s,
                     "enqueue_prompts_per_s": summary.published / enq_s,
                     "enqueue_cpu_us_per_prompt": enq_cpu / summary.published * 1e6,
                     "prompt_tokens": summary.prompt_tokens,
                     "ratio": (summary.published / enq_s) / (len(prompts) / tok_s)})
    lab.flush()
    return {
        "prompts": len(prompts),
        "batch": BATCH,
        "tokenize_prompts_per_s": statistics.median(r["tokenize_prompts_per_s"] for r in reps),
        "enqueue_prompts_per_s": statistics.median(r["enqueue_prompts_per_s"] for r in reps),
        "enqueue_cpu_us_per_prompt": statistics.median(r["enqueue_cpu_us_per_prompt"] for r in reps),
        "ratio": statistics.median(r["ratio"] for r in reps),
        "mean_prompt_tokens": reps[0]["prompt_tokens"] / len(prompts),
        "reps": reps,
    }


def run_producer_speed(lab: Lab, opts: ProducerOptions, log) -> dict:
    long = long_prompts(opts.prompts, opts.prompt_tokens, token_count)
    return {"long": measure(lab, "long", long, opts, log),
            "short": measure(lab, "short", repeated(opts.prompts), opts, log)}
