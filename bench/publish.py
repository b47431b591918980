"""Enqueueing through the producer's own code path, in this process.

`python -m producer enqueue` builds a `RunSpec` and calls
`producer.enqueue.enqueue_file`; the bench does the same (so the tokenizer is
loaded once for all parts rather than once per subprocess). The settings are
read from the environment when `enqueue` runs, after `Lab` has set `REDIS_URL`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def chat_tokenizer():
    """The bundled DeepSeek-R1-style tokenizer, as the producer loads it."""
    from contract.chat.template import ChatTokenizer

    return ChatTokenizer("bundled")


def token_count(text: str) -> int:
    """Tokens of a piece of text alone (no template), for sizing prompts."""
    return len(chat_tokenizer().tok(text, add_special_tokens=False)["input_ids"])


def build_spec(run: str, max_new_tokens: int, temperature: float = 0.6, top_p: float = 0.95, turns: str = "last",
               samples: int = 1):
    """The RunSpec `python -m producer enqueue --run RUN --max-new-tokens M [--turns all] [--samples N]` would store."""
    from producer.enqueue import new_spec

    return new_spec(chat_tokenizer(), run, "bundled", max_new_tokens, temperature, top_p, turns=turns, samples=samples)


def prepare(run: str, max_new_tokens: int, turns: str = "last", samples: int = 1):
    """Record the run's spec before any prompt (as `enqueue` does first): a worker started now
    knows the run, and warms its tokenizer for a run of conversations."""
    from contract.redis_link.connections import redis_for
    from contract.settings import SharedSettings
    from producer.enqueue import prepare_run

    return prepare_run(redis_for(SharedSettings().redis_url), build_spec(run, max_new_tokens, turns=turns,
                                                                         samples=samples))


def enqueue(path: Path, run: str, max_new_tokens: int, turns: str = "last", samples: int = 1):
    """Publish a prompt file as run `run`; returns the producer's EnqueueSummary."""
    from contract.broker.config import celery_app
    from contract.redis_link.connections import redis_for
    from contract.settings import SharedSettings
    from producer.enqueue import enqueue_file, prepare_run

    settings = SharedSettings()
    app = celery_app(settings.redis_url, queue=settings.queue_prefix)
    client = redis_for(settings.redis_url)
    spec = prepare_run(client, build_spec(run, max_new_tokens, turns=turns, samples=samples))
    summary = enqueue_file(path, spec, chat_tokenizer(), client, app, settings.queue_prefix)
    if summary.rejected or summary.published == 0:
        raise RuntimeError(f"enqueue of {path} published {summary.published}, "
                           f"rejected {summary.rejected[:3]}")
    return summary


def sampling_params(max_new_tokens: int) -> dict:
    """What a worker sends as `sampling_params` for such a run."""
    return dict(build_spec("x", max_new_tokens).sampling)
