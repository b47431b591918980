"""After a conversation's turn is stored: render the next turn and queue it.

Turn k+1 of a conversation (`enqueue --turns all`) is made here, in a worker,
once turn k is durably stored: its answer is read from turn k's canonical row
(the row the ledger names; the one this task just stored, else read back from
its shard), its history is rendered with the run's own tokenizer and template
(`contract.chat.template`, loaded once per process, in the background from the
worker's start or a conversation run's first turn: `warm`; a worker whose tokenizer or
template fingerprint differs from the run's refuses to render rather than
render differently), and `ConversationLedger.advance` keeps the answer and
queues turn k+1 with its ids in one conditional step, then its message is
published. The server that generated turn k goes into the ledger with it, so
turn k+1 is sent where its prefix is cached (`workers/servers/affinity.py`). A crash
anywhere in between leaves the conversation at turn k with turn k done, which
the redelivery of turn k's message and the audit's sweep (`stalled`,
`resume`) both finish, and `advance` lets only one call through, so no
turn is queued twice and no stored turn is generated again. A message lost
after `advance` leaves turn k+1 queued without one, which the audit republishes.
"""
from __future__ import annotations

import logging
import threading
from functools import lru_cache

from contract.ledger.conversation_ledger import BURIED_NEXT, COMPLETE, QUEUED_NEXT, ConversationLedger
from contract.chat.conversations import answer_message, split_turn_id, turn_history, turn_id
from contract.ledger.deadletters import DeadLetter
from contract.keys import queue_for
from contract.ledger.ledger import Ledger, shard_code
from contract.names import PromptState, Reason, Thinking
from contract.broker.publish import publish_prompts
from contract.storage import store_for
from contract.run.spec import RunSpec

log = logging.getLogger(__name__)
_LOADING = threading.Lock()
_RENDERING = threading.Lock()  # one tokenizer, many task threads: render one history at a time


class TemplateMismatch(Exception):
    """This worker's tokenizer or template is not the run's: it must not render the run's turns."""


@lru_cache(maxsize=4)
def _chat(tokenizer: str, trust_remote_code: bool):
    from contract.chat.template import ChatTokenizer
    return ChatTokenizer(tokenizer, trust_remote_code)


def chat_for(spec: RunSpec):
    """The run's tokenizer, checked against the fingerprints the producer recorded."""
    with _LOADING:
        chat = _chat(spec.tokenizer, spec.trust_remote_code)
    if (chat.fingerprint(), chat.template_fingerprint()) != (spec.tokenizer_fingerprint, spec.template_fingerprint):
        raise TemplateMismatch(
            f"tokenizer {spec.tokenizer!r} loads here with fingerprints {chat.fingerprint()}/"
            f"{chat.template_fingerprint()}, the run's are {spec.tokenizer_fingerprint}/"
            f"{spec.template_fingerprint}: this worker does not render run {spec.name!r}'s turns")
    return chat


_WARMED: set[tuple[str, bool]] = set()


def warm(spec: RunSpec) -> None:
    """Load a conversation run's tokenizer in the background, once per process: loading it
    (transformers, the tokenizer files) takes seconds, and a worker that began it only when its
    first turns were stored held every one of them, and so its whole prefetch, waiting for it."""
    key = (spec.tokenizer, spec.trust_remote_code)
    with _LOADING:
        if key in _WARMED:
            return
        _WARMED.add(key)
    threading.Thread(target=_load, args=(spec,), name="fleet-warm-tokenizer", daemon=True).start()


def warm_runs(client) -> None:
    """At a worker's start: warm the tokenizers of the conversation runs, and of the runs with a
    verifier (whose answers are decoded for it: `verdicts.py`), in Redis."""
    from contract.run.spec import OlderLayout, load_spec
    from contract.keys import RUNS

    try:
        for raw in sorted(client.smembers(RUNS)):
            try:
                spec = load_spec(client, raw.decode())
            except (OlderLayout, ValueError):
                continue
            if spec is not None and (spec.turns == "all" or spec.verify):  # both decode answers
                warm(spec)
    except Exception as exc:  # Redis not up yet: the first turn of a conversation run warms it
        log.debug("tokenizers not warmed at start: %r", exc)


def _load(spec: RunSpec) -> None:
    try:
        chat_for(spec)
        log.info("tokenizer %s loaded for conversation run %s", spec.tokenizer, spec.name)
    except Exception as exc:  # this worker will say so, per turn, when it tries to render
        log.warning("tokenizer %s of conversation run %s could not be loaded: %r", spec.tokenizer, spec.name, exc)


def advance(app, rt, spec: RunSpec, prompt_id: str,
            stored: tuple[str, list[int], int, str] | None = None) -> str:
    """Move the conversation of turn `prompt_id` past it, if that turn is done and the
    conversation still at it. `stored`: (shard path, input ids, prompt length, server) of the row
    this task just stored, used when it is the canonical one. Returns what happened, for the log."""
    conversation, turn = split_turn_id(prompt_id)
    conversations = ConversationLedger(rt.redis, spec.name)
    place = conversations.in_progress(conversation)
    if place is None or place.at != turn:
        return "already past this turn"
    entry = Ledger(rt.redis, spec.name).entries([prompt_id])[0]
    if entry.state != PromptState.DONE:
        return f"turn is {entry.state}"
    chat = chat_for(spec)
    if stored is None or shard_code(stored[0]) != entry.shard:
        stored = _canonical_row(rt.settings.output_dir, spec.name, prompt_id, entry.shard)
    _, input_ids, prompt_len, server = stored
    answer = answer_message(input_ids[prompt_len:], spec.think_start_id, spec.think_end_id, spec.stop_ids,
                            lambda ids: chat.tok.decode(ids, skip_special_tokens=False))
    if not spec.history_reasoning:  # the template drops it: Redis need not keep it
        answer.pop("reasoning_content", None)
    if turn + 1 >= place.turns:
        return conversations.advance(conversation, turn, answer, place.turns, server=server)
    history = turn_history(place.shape, conversations.answers(conversation, turn) + [answer], turn + 1)
    next_ids, failure = _render(chat, spec, history)
    letter = None if failure is None else (str(Reason.WORKER_ERROR), _letter(rt, spec, conversation, turn + 1,
                                                                            failure))
    outcome = conversations.advance(conversation, turn, answer, place.turns, next_ids, letter, server)
    following = turn_id(conversation, turn + 1)
    if outcome == QUEUED_NEXT:
        publish_prompts(app, spec.name, queue_for(rt.settings.queue_prefix, spec.served_model),
                        [(following, len(next_ids), None)])
    elif outcome == BURIED_NEXT:
        log.warning("conversation %s stopped at turn %d: %s", conversation, turn + 1, failure)
    return outcome


def stalled(rt, spec: RunSpec) -> set[str]:
    """The turns that are done while their conversation is still at them: found in two sweeps
    in a row (`resume`), their worker died between storing the turn and moving on."""
    conversations, ledger = ConversationLedger(rt.redis, spec.name), Ledger(rt.redis, spec.name)
    found: set[str] = set()
    page: list[str] = []
    for conversation, at in conversations.positions():
        page.append(turn_id(conversation, at))
        if len(page) >= 500:
            found.update(p for p, state in zip(page, ledger.states(page)) if state == PromptState.DONE)
            page = []
    found.update(p for p, state in zip(page, ledger.states(page)) if state == PromptState.DONE)
    return found


def resume(app, rt, spec: RunSpec, turns: set[str]) -> int:
    """Move on the conversations of these stored turns (the audit's sweep); returns how many moved."""
    moved = 0
    for prompt_id in sorted(turns):
        try:
            outcome = advance(app, rt, spec, prompt_id)
        except Exception as exc:  # this worker cannot render (another template?), or a shard is missing
            log.error("audit: conversation turn %s is stored but its conversation cannot move on here: %r",
                      prompt_id, exc)
            continue
        if outcome in (QUEUED_NEXT, BURIED_NEXT, COMPLETE):
            moved += 1
            log.warning("audit: turn %s was stored but its conversation had not moved on: %s", prompt_id, outcome)
    return moved


def _render(chat, spec: RunSpec, history: list[dict]) -> tuple[list[int] | None, str | None]:
    """The next turn's prompt ids, or why there are none (a template that refuses the history,
    a prompt that does not end with think-start where the run requires it)."""
    try:
        with _RENDERING:
            ids = chat.render([history])[0]
    except Exception as exc:
        return None, f"the chat template or tokenizer failed on the turn's history: {exc.__class__.__name__}: {exc}"[:500]
    if spec.thinking == Thinking.PROMPT and not chat.ends_with_think_start(ids):
        return None, "the turn's rendered prompt does not end with the think-start token"
    return ids, None


def _letter(rt, spec: RunSpec, conversation: str, turn: int, failure: str) -> str:
    return DeadLetter(id=turn_id(conversation, turn), run=spec.name, reason=str(Reason.WORKER_ERROR),
                      message=f"conversation {conversation} turn {turn} could not be rendered: {failure}",
                      attempts=0, servers=[], worker=rt.worker, prompt_b64="", prompt_tokens=0,
                      sampling=dict(spec.sampling), excerpt={"conversation": conversation, "turn": turn}).to_json()


def _canonical_row(output_dir: str, run: str, prompt_id: str, code: int | None) -> tuple[str, list[int], int, str]:
    """The stored row the ledger names for a turn: found by its shard's code among the run's shards."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    store = store_for(output_dir)
    for location in store.shards(run):
        if shard_code(location) != code:
            continue
        table = pq.read_table(store.source(location), columns=["id", "input_ids", "prompt_len", "server"],
                              filters=pc.field("id") == prompt_id)
        if table.num_rows:
            row = table.slice(0, 1).to_pylist()[0]
            return location, row["input_ids"], row["prompt_len"], row["server"]
    raise LookupError(f"turn {prompt_id}: no shard of run {run!r} under {store.where(run)} holds its stored row "
                      f"(shard code {code})")


def turn_columns(spec: RunSpec, prompt_id: str) -> dict:
    """The `conversation` and `turn` columns of a row of `spec`'s run."""
    if spec.turns != "all":
        return {}
    conversation, turn = split_turn_id(prompt_id)
    return {"conversation": conversation, "turn": turn}
