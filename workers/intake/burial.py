"""Every dead letter goes through `bury`: one choke point, so each is stored once, counted and logged.

A dead letter is made here too (`dead_letter`): the prompt's ids, what was sent, the servers it
went to and, where an answer came back, an excerpt of it (its think-token positions included), so
`dead show` says what went wrong without the server's log. `bury` names a sample's letter by its
prompt and sample, a conversation turn's by its turn, moves an until-verified chain on
(`chains.py`), and stores the letter unless the prompt is already done (`put_letter`: on a
replicated Redis, only once a replica has it).
"""
from __future__ import annotations

import logging

import redis

from contract.ledger.codec import b64_to_ids, ids_to_b64
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.names import PromptState
from contract.redis_link.replication import expected, replicated, written_again
from contract.run.spec import RunSpec

from ..output.turns import turn_columns
from ..output.verify import think_positions
from ..reporting import metrics
from ..servers.sglang_client import Generation
from . import chains
from .attempts import Attempts
from .runtime import Runtime
from .specs import cached_spec

log = logging.getLogger(__name__)


class Buried(str):
    """What a task returns for a prompt it dead-lettered: the task raises `DeadLettered`
    from it, so Flower and Celery's events show the prompt as failed with its reason."""

    def __new__(cls, letter: DeadLetter) -> "Buried":
        buried = super().__new__(cls, f"dead: {letter.reason}")
        buried.reason, buried.message = str(letter.reason), letter.message
        return buried


class DeadLettered(Exception):
    """A task's failure that Celery must not retry: the prompt is in the dead-letter queue.
    Its args are its constructor's, so Celery's pickle check keeps it as itself (an expected
    failure, in the task's `throws`) rather than wrapping it as an unexpected one."""

    def __init__(self, reason: str, message: str):
        super().__init__(reason, message)
        self.reason, self.message = reason, message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    def __repr__(self) -> str:  # what Flower shows of a failed task
        return f"{type(self).__name__}({str(self)!r})"


def bury(rt: Runtime, letter: DeadLetter, forgotten: bool = False) -> str:
    """Every dead letter goes through here: stored unless the prompt is already done,
    counted in the metrics, logged; in an until-verified run, its sample's chain moves on first
    (`chains.py`). `forgotten`: the ledger lost the prompt (see `Ledger.bury`)."""
    try:
        spec = cached_spec(rt.settings.redis_url, letter.run)
    except LookupError:  # a run whose spec cannot be read: its letter stays as made
        spec = None
    if spec is not None:
        _name_sample(spec, letter)
        letter.excerpt.update(_turn_of(spec, letter))
        _chain_on(rt, spec, letter)
    found = put_letter(rt.redis, letter, forgotten)
    if found == PromptState.DONE or found is None:
        log.warning("prompt %s is %s: its %s failure (%s) is not dead-lettered", letter.key,
                    "already stored" if found else "not in the ledger", letter.reason, letter.message)
        return f"not dead-lettered: prompt is {found or 'unknown'}"
    if found == PromptState.QUEUED:
        metrics.PROMPTS.labels(letter.run, "dead").inc()
    metrics.DEAD_LETTERS.labels(letter.reason).inc()
    log.info("prompt %s of run %s dead-lettered, %s: %s; details: python -m producer dead show %s --run %s",
             letter.key, letter.run, letter.reason, letter.message, letter.key, letter.run)
    return Buried(letter)


def put_letter(client: redis.Redis, letter: DeadLetter, forgotten: bool = False) -> str | None:
    """Store the letter (`DeadLetters.put`). Its message is acknowledged next, so where the
    primary has replicas it returns only once a replica has the letter, stored again on the new
    primary after a failover: a letter an old primary took in its last second would be lost with
    it, and its prompt left queued without a message until the audit found it."""
    letters = DeadLetters(client, letter.run)
    if not expected(client):  # a plain Redis without replicas: one call, as it was
        return letters.put(letter, forgotten)

    def once() -> str | None:
        with replicated(client):
            return letters.put(letter, forgotten)
    return written_again(once, f"the dead letter of prompt {letter.key} of run {letter.run}")


def dead_letter(rt: Runtime, spec: RunSpec, prompt_id: str, prompt_ids: list[int], sampling: dict,
                tries: Attempts, reason: str, message: str,
                generation: Generation | None = None, excerpt: dict | None = None) -> DeadLetter:
    """The prompt's letter: what was sent, where, and the answer's excerpt where one came back."""
    excerpt = dict(excerpt or {})
    if generation is not None:
        out = generation.output_ids
        excerpt = {
            "output_len": len(out),
            "last_output_ids": out[-64:],
            "first_output_ids": out[:16],
            "finish_reason": generation.meta_info.get("finish_reason"),
            "completion_tokens": generation.meta_info.get("completion_tokens"),
            "prompt_tokens_seen": generation.meta_info.get("prompt_tokens"),
            "server": generation.server,
            **think_positions(out, spec),
        }
    return DeadLetter(
        id=prompt_id, run=spec.name, reason=reason, message=message, attempts=tries.total,
        servers=sorted(set(tries.servers)), worker=rt.worker, prompt_b64=ids_to_b64(prompt_ids),
        prompt_tokens=len(prompt_ids), sampling=sampling, excerpt=excerpt,
        first_attempt_at=tries.started_at,
    ).of_sample(spec.samples)


def _name_sample(spec: RunSpec, letter: DeadLetter) -> None:
    """A letter made for a sample's ledger key names its prompt's id and its sample (`key` gives
    the ledger key back); a key that is no sample's keeps itself as its id."""
    try:
        letter.of_sample(spec.samples)
    except ValueError:
        pass


def _chain_on(rt: Runtime, spec: RunSpec, letter: DeadLetter) -> None:
    """In an until-verified run, a dead-lettered sample queues the next of its chain (`chains.py`)."""
    if spec.until_verified is not None and letter.prompt_b64:
        chains.follow(rt, spec, letter.key, b64_to_ids(letter.prompt_b64))


def _turn_of(spec: RunSpec, letter: DeadLetter) -> dict:
    """A conversation turn's dead letter names its conversation and turn index."""
    try:
        return turn_columns(spec, letter.id)
    except ValueError:
        return {}

