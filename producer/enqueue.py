"""Publishing a prompt file as one task per prompt.

The file is JSONL (`prompts.py`), or a table: a Parquet file or a `datasets`
folder, whose rows are read as lines are (`prompt_tables.py`); the rest of this
module does not tell them apart, but for the word its report uses ("row").

Each batch of lines is validated, checked against the run's ledger (a re-run
publishes only prompts not yet queued, done or dead), tokenized with the chat
template, checked for the think-start token, and published through one
pipelined kombu producer with compact arguments and a short `argsrepr`.

**Each prompt is published once, and memory is flat in the file's size.** No
set of ids is kept here: the ledger's enqueue script (atomic, set-if-absent)
says which prompts of a batch were new, and only those are published, so a
repeat of an id within the file, and two producers started on the same file,
publish each prompt once. The script also says when a prompt it already had
was queued by this same call (an earlier line: a duplicate) rather than by
another call; a repeat whose first line's prompt is already done or dead by
then is counted as already in the run. Reported lines are kept up to
`MAX_REPORTED` each, then only counted.
Tokenizing (mostly Rust, which releases the GIL) of one batch overlaps the
publishing of the batch before it, so publishing adds little to a run.

Faults stay local: a bad line is a `BadLine` from the reader (it never
raises), and a prompt the chat template or the tokenizer fails on is found by
rendering its batch one prompt at a time, the same way, and rejected alone; the
other prompts of the batch are published.

**A line's own sampling reaches every sample of its prompt.** A line with
a `sampling` object (`contract/run/line_sampling.py`) gets a record in the run's
line hash (`contract/run/line_fields.py`), written before its prompt enters the
ledger, so no worker and no republication by the audit finds the prompt
without it; the first line of a repeated id keeps its record. Workers read a
run's spec once, so whether they read these records at all (`RunSpec.line_fields`)
is decided when the run starts, from the file (`prompts.mentions_line_fields`);
a later enqueue into a run started without them rejects such a line (with its
number) rather than queue a prompt whose sampling no worker would read.

**Several samples a prompt** (`--samples N`): each prompt is tokenized once
and recorded as N ledger entries, one per sample, keyed `<id>~<index>`
(`contract/run/samples.py`), each with its own copy of the token ids (a worker's
intake reads a key's ids in one call, so N copies sit in Redis while the
samples are queued) and its own message. A prompt is skipped on a re-run only
when every one of its samples is in the run; otherwise the samples it lacks
are published (`contract.broker.publish.publish_samples`, which takes any subset of the indices; with
`--until-verified K` enqueue queues only each chain's first sample,
`contract.run.samples.first_indices`, and a worker the rest).
The samples of a prompt go to one server (prefix affinity) and should find
its prompt in that server's cache: published one after the other they would
start together and be prefilled in the same step, before the cache holds the
prompt. So each group of `SPREAD` prompts (`contract.broker.publish.spread`) is published sample 0 of each, then
sample 1 of each, and so on: a prompt's next sample follows `SPREAD` messages
later, once the one before it has been prefilled.
`--samples` above 1 with `--turns all` is refused (`SamplesRefused`).

`--turns all` reads each line as a conversation whose every assistant turn is
regenerated (`contract/chat/conversations.py`): only turn 0 is rendered and queued
here, as prompt `<id>#0`, after its conversation is registered; each later
turn is rendered and queued by the worker that stored the turn before it.

`--verify NAME` keeps each line's own fields (`answer`, ...) for the workers'
verifier: recorded per prompt (`contract/run/line_fields.py`) in the same
transaction that queues it (`_enqueue`), so a worker never takes a prompt whose
fields are not there yet; a later line repeating an id never replaces them.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import redis

from contract.redis_link.clock import CLOCK
from contract.ledger.codec import pack_ids
from contract.ledger.conversation_ledger import ConversationLedger
from contract.chat.conversations import ALL, LAST, skeleton, turn_history, turn_id, turns
from contract.keys import queue_for
from contract.broker.kombu_redis import queue_depth
from contract.ledger.ledger import AGAIN, NEW, Entry, Ledger
from contract.run.line_fields import LineFields
from contract.names import PromptState, Thinking
from contract.broker.publish import enqueue_samples, new_messages, publish_prompts
from contract.redis_link.replication import replicated
from contract.run.samples import first_indices, sample_key
from contract.run.spec import RunSpec, load_spec, save_spec
from contract.chat.tokenizer_probe import make_probe

from contract.chat.template import ChatTokenizer
from .prompt_tables import TableSource, is_table
from .prompts import DEFAULT_COLUMNS, MAX_LINE_BYTES, BadLine, Columns, Prompt, line_record, read_prompts

BATCH = 256  # prompts tokenized and published together
MAX_REPORTED = 1000  # rejected and duplicate lines kept with their numbers; the rest are counted
UNREAD_SAMPLING = ('line has its own "sampling", but run {run!r} was started from a file without any, so its '
                   'workers do not read one: enqueue such lines under a new run (--run NEW_NAME)')


def _render_failed(exc: BaseException) -> bool:
    """Whether rendering one prompt failed (any Exception, or a panic of the Rust tokenizer,
    which pyo3 raises as a BaseException), rather than the process being asked to stop."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


@dataclass
class Rejection:
    line: int
    id: str | None
    reason: str


@dataclass
class EnqueueSummary:
    run: str
    queue: str
    published: int = 0       # samples published (prompts, in a run of one sample a prompt)
    prompts: int = 0         # prompts with at least one sample published
    prompt_tokens: int = 0
    already: dict[str, int] = field(default_factory=dict)   # state -> count, skipped on a re-run
    duplicates: list[Rejection] = field(default_factory=list)  # the first MAX_REPORTED
    rejected: list[Rejection] = field(default_factory=list)    # the first MAX_REPORTED
    duplicate_count: int = 0
    rejected_count: int = 0
    seconds: float = 0.0
    held_back: float = 0.0  # seconds spent waiting for the queue to drain
    unit: str = "line"      # what a rejection's number counts: a JSONL file's lines, or a table's rows (from 0)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def skipped(self) -> int:
        return sum(self.already.values()) + self.duplicate_count

    def reject(self, line: int, prompt_id: str | None, reason: str) -> None:
        """A line that is not published (bad, or refused by the tokenizer); from either thread."""
        with self._lock:
            self.rejected_count += 1
            if len(self.rejected) < MAX_REPORTED:
                self.rejected.append(Rejection(line, prompt_id, reason))

    def skip(self, prompt: Prompt, outcome: str) -> None:
        """A prompt the run already has: a repeat of an earlier line (AGAIN), or in a state."""
        if outcome == AGAIN:
            self.duplicate_count += 1
            if len(self.duplicates) < MAX_REPORTED:
                self.duplicates.append(Rejection(prompt.line, prompt.id, "duplicate id (first one kept)"))
        else:
            self.already[outcome] = self.already.get(outcome, 0) + 1


@dataclass(frozen=True)
class FirstTurn(Prompt):
    """`--turns all`: a conversation, as the prompt of its turn 0 (id `<conversation>#0`)."""
    conversation: str = ""
    shape: list = field(default_factory=list)
    turns: int = 0


def _first_turn(item: Prompt | BadLine) -> FirstTurn | BadLine:
    """A conversation's turn 0: its first user turn (and what precedes it), original answers dropped."""
    if isinstance(item, BadLine):
        return item
    shape = skeleton(item.messages)
    return FirstTurn(item.line, turn_id(item.id, 0), turn_history(shape, [], 0), sampling=item.sampling,
                     conversation=item.id, shape=shape, turns=turns(shape))


def line_id(prompt: Prompt) -> str:
    """The id a line's record is kept under: its prompt's, or for `--turns all` its conversation's
    (every turn of it is sampled as the line says)."""
    return prompt.conversation if isinstance(prompt, FirstTurn) else prompt.id


class RunMismatch(Exception):
    """The run was started with another tokenizer, template or sampling."""


class SamplesRefused(ValueError):
    """`--samples` above 1 with `--turns all`: a conversation's turns are rendered from the one
    answer stored for each turn before them, which several samples would not name."""


def check_samples(samples: int, turns: str, until_verified: int | None = None, verify: str | None = None) -> None:
    """`--samples N` (and `--until-verified K`, which needs a verifier and N of at least K), or
    `SamplesRefused` with one line."""
    if until_verified is not None:
        if verify is None:
            raise SamplesRefused("--until-verified needs --verify NAME: it counts the samples that pass")
        if until_verified > samples:
            raise SamplesRefused(f"--until-verified {until_verified} needs --samples N of at least {until_verified} "
                                 f"(N: the most samples a prompt gets), not {samples}")
    if samples < 1:
        raise SamplesRefused(f"--samples must be 1 or more, not {samples}")
    if samples > 1 and turns == ALL:
        raise SamplesRefused("--samples above 1 does not go with --turns all: each turn is rendered from the "
                             "one stored answer of the turn before it; enqueue the conversations with "
                             "--turns last for several samples of their last turn")


def new_spec(chat: ChatTokenizer, name: str, tokenizer: str, max_new_tokens: int, temperature: float,
             top_p: float, thinking: str = "auto", served_model: str | None = None,
             disabled_rules: Iterable[str] = (), turns: str = LAST, trust_remote_code: bool = False,
             verify: str | None = None, logprobs: int | None = None, line_fields: bool = False,
             samples: int = 1, until_verified: int | None = None) -> RunSpec:
    """The spec `enqueue` records for a run: tokenizer identity, sampling, think tokens, samples a
    prompt, the verifier of its answers (`verify`). `line_fields`: whether some line carries its own sampling
    (`prompts.mentions_line_fields`); a run with a verifier keeps every line's fields too. Decided
    once for the run, as workers read a run's spec once."""
    check_samples(samples, turns, until_verified, verify)
    return RunSpec(
        name=name, tokenizer=tokenizer, tokenizer_fingerprint=chat.fingerprint(),
        template_fingerprint=chat.template_fingerprint(),
        sampling={"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                  "skip_special_tokens": False},
        thinking=chat.detect_thinking() if thinking == "auto" else thinking,
        think_start_id=chat.think_start_id, think_end_id=chat.think_end_id,
        stop_ids=chat.stop_ids(), served_model=served_model, disabled_rules=sorted(disabled_rules),
        vocab_size=len(chat.tok), turns=turns, trust_remote_code=trust_remote_code,
        history_reasoning=turns == ALL and chat.renders_history_reasoning(),
        probe=make_probe(chat.tok).to_dict(), verify=verify, logprobs=logprobs or None,
        line_fields=line_fields or verify is not None,
        samples=samples, until_verified=until_verified,
    )


def prepare_run(client: redis.Redis, spec: RunSpec) -> RunSpec:
    """Store a new run's spec, or check that this enqueue matches the stored one."""
    existing = load_spec(client, spec.name)
    if existing is None:
        spec = dataclasses.replace(spec, created_at=CLOCK.now(client))  # aged by `status` on Redis's clock
        save_spec(client, spec)
        return spec
    if existing.fingerprint() != spec.fingerprint():
        old, new = existing.identity(), spec.identity()
        # a newer field is in an identity only where set (`RunSpec.identity`): either side may lack it
        diff = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
                         if old.get(k) != new.get(k))
        raise RunMismatch(f"run {spec.name!r} was enqueued differently ({diff}); "
                          f"pass --run NEW_NAME to start a new run")
    return existing


def enqueue_file(path: Path, spec: RunSpec, chat: ChatTokenizer, client: redis.Redis, app,
                 queue_prefix: str, max_prompt_tokens: int | None = None,
                 on_progress: Callable[[int], None] | None = None,
                 max_queue_depth: int = 0, max_line_bytes: int = MAX_LINE_BYTES,
                 columns: Columns = DEFAULT_COLUMNS) -> EnqueueSummary:
    """Publish the prompts of `path`: a JSONL file, or a table (a Parquet file or a `datasets`
    folder, `prompt_tables.py`: its rows read as lines are, numbered from 0)."""
    queue = queue_for(queue_prefix, spec.served_model)
    table = TableSource(path, columns) if is_table(path) else None  # refused whole here, before any publish
    summary = EnqueueSummary(run=spec.name, queue=queue, unit="row" if table else "line")
    ledger, call = Ledger(client, spec.name), secrets.token_hex(4)  # this call, as the ledger knows it
    first = first_indices(spec.samples, spec.until_verified)  # the samples enqueue queues for each prompt
    started = time.monotonic()

    def publish(ready: list[tuple[Prompt, list[int]]]) -> None:
        if ready and max_queue_depth:
            summary.held_back += _hold_back(client, queue, max_queue_depth)
        _publish(ready, spec, app, queue, ledger, call, summary)

    with _opened(path, table) as handle, ThreadPoolExecutor(1, thread_name_prefix="tokenize") as tokenizer:
        tokenized: Future | None = None  # the batch being tokenized while the one before is published
        items = iter(table) if table else read_prompts(handle, max_line_bytes, columns)
        if spec.turns == ALL:
            items = map(_first_turn, items)
        for batch in _batches(items, BATCH):
            fresh = _select(batch, spec, ledger, call, summary, first)
            following = tokenizer.submit(_tokenize, fresh, spec, chat, max_prompt_tokens, summary)
            if tokenized:
                publish(tokenized.result())
            tokenized = following
            if on_progress:
                on_progress(table.position if table else handle.tell())
        if tokenized:
            publish(tokenized.result())
    summary.rejected.sort(key=lambda r: r.line)  # bad lines and tokenizer refusals, found in two threads
    summary.seconds = time.monotonic() - started
    return summary


def _records(prompts: Iterable[Prompt], spec: RunSpec) -> dict[str, dict]:
    """The line records of these prompts (`prompts.line_record`): the first line of each id decides,
    as it is the one queued (a repeat's sampling or fields are not its prompt's)."""
    first: dict[str, dict | None] = {}
    for prompt in prompts:
        first.setdefault(line_id(prompt), line_record(prompt, spec.verify is not None))
    return {key: record for key, record in first.items() if record is not None}


@contextmanager
def _opened(path: Path, table: TableSource | None):
    """The JSONL file, open for reading (a table opens its own files as it is read)."""
    if table is not None:
        yield None
        return
    with open(path, "rb") as handle:
        yield handle


def _hold_back(client: redis.Redis, queue: str, bound: int, poll: float = 1.0) -> float:
    """Wait while the queue is deeper than `bound`, so a run of 10^7 prompts never sits
    in Redis at once; returns the seconds waited."""
    waited = 0.0
    while queue_depth(client, queue) > bound:
        time.sleep(poll)
        waited += poll
    return waited


def _batches(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _select(batch: list[Prompt | BadLine], spec: RunSpec, ledger: Ledger, call: str,
            summary: EnqueueSummary, indices: range = range(1)) -> list[Prompt]:
    """Drop bad lines and prompts the run already has (every one of the samples `indices` that
    enqueue queues, of `spec.samples` a prompt), before they are tokenized (a repeat within the
    batch, or of a batch still being tokenized, is caught at `_publish`)."""
    prompts = []
    for item in batch:
        if isinstance(item, BadLine):
            summary.reject(item.line, None, item.reason)
        elif item.sampling and not spec.line_fields:
            summary.reject(item.line, item.id, UNREAD_SAMPLING.format(run=spec.name))
        else:
            prompts.append(item)
    fresh = []
    n = len(indices)
    entries = ledger.entries([sample_key(p.id, i, spec.samples) for p in prompts for i in indices])
    for number, prompt in enumerate(prompts):
        mine = entries[number * n:(number + 1) * n]
        missing = [e for e in mine if e.state is None]
        if missing:  # a prompt with a sample still to publish
            fresh.append(prompt)
        else:
            summary.skip(prompt, _outcome(mine[0], call))
    return fresh


def _outcome(entry: Entry, call: str) -> str:
    """What the enqueue script would say of a prompt the run has."""
    return AGAIN if entry.state == PromptState.QUEUED and entry.call == call else str(entry.state)


def _tokenize(prompts: list[Prompt], spec: RunSpec, chat: ChatTokenizer,
              max_prompt_tokens: int | None, summary: EnqueueSummary) -> list[tuple[Prompt, list[int]]]:
    if not prompts:
        return []
    try:
        rendered: list = chat.render([p.messages for p in prompts])
    except BaseException as exc:  # one conversation the template or the tokenizer refuses: find it
        if not _render_failed(exc):
            raise
        rendered = [_render_or_none(chat, p, summary) for p in prompts]
    ready = []
    for prompt, ids in zip(prompts, rendered):
        if ids is None:
            continue
        if spec.thinking == Thinking.PROMPT and not chat.ends_with_think_start(ids):
            summary.reject(prompt.line, prompt.id, "rendered prompt does not end with the think-start token")
        elif max_prompt_tokens and len(ids) > max_prompt_tokens:
            summary.reject(prompt.line, prompt.id, f"prompt_too_long: {len(ids)} tokens > {max_prompt_tokens}")
        else:
            ready.append((prompt, ids))
    return ready


def _render_or_none(chat: ChatTokenizer, prompt: Prompt, summary: EnqueueSummary) -> list[int] | None:
    """The prompt rendered alone, the same way as in a batch (so its ids do not depend on
    whether a neighbour failed), or None once its failure is recorded."""
    try:
        return chat.render([prompt.messages])[0]
    except BaseException as exc:
        if not _render_failed(exc):
            raise
        summary.reject(prompt.line, prompt.id,
                       f"chat template or tokenizer failed: {exc.__class__.__name__}: {str(exc)[:300]}")
        return None


def _publish(ready: list[tuple[Prompt, list[int]]], spec: RunSpec, app, queue: str, ledger: Ledger,
             call: str, summary: EnqueueSummary) -> None:
    """Record the prompts (with their token ids), then publish those the ledger did not have:
    a crash in between leaves queued prompts without a message, which the workers' audit
    republishes; a prompt another producer (or an earlier line) queued first is skipped.
    They count as published once a replica has both (`replicated`); a failover meanwhile
    stops the call (`FailedOver`): a re-run skips what the new primary has."""
    if not ready:
        return
    with replicated(ledger.client):  # counted below only once a replica has entries and messages
        if spec.turns == ALL:  # the conversation first, so no worker finds its turn 0 without it
            ConversationLedger(ledger.client, spec.name).register(
                [(p.conversation, p.turns, p.shape) for p, _ in ready])
        outcomes = _enqueue(ledger, spec, ready, call)
        first = list(first_indices(spec.samples, spec.until_verified))
        publish_prompts(app, spec.name, queue,
                        new_messages(spec.samples, [(p.id, ids, first) for p, ids in ready], outcomes))
    for (prompt, ids), found in zip(ready, outcomes):
        published = sum(outcome == NEW for outcome in found)
        if published:
            summary.prompts += 1
            summary.published += published
            summary.prompt_tokens += published * len(ids)
        else:
            summary.skip(prompt, found[0])


def _enqueue(ledger: Ledger, spec: RunSpec, ready: list[tuple[Prompt, list[int]]], call: str) -> list[list[str]]:
    """The ledger's enqueue of `ready`: per prompt, the outcome of each sample enqueue queues
    (`contract.run.samples.first_indices`; one in a run of one sample), as `Ledger.enqueue` says. Each
    line's record for workers is written first (`contract/run/line_fields.py`), so no worker takes a
    prompt whose record is not there yet. The first line of an id keeps its record: one made here
    for a prompt the ledger took nothing of is a repeated id's, not its line's, and is dropped again."""
    lines = LineFields(ledger.client, spec.name)
    recorded = lines.add_new(_records((p for p, _ in ready), spec)) if spec.line_fields else []
    if spec.samples == 1:  # each prompt its own key, as before samples existed
        outcomes = [[o] for o in ledger.enqueue([(p.id, pack_ids(ids)) for p, ids in ready], call)]
    else:
        every = first_indices(spec.samples, spec.until_verified)  # all N, unless until-verified's first
        outcomes = enqueue_samples(ledger, spec.samples, call, [(p.id, ids, every) for p, ids in ready])
    taken = {line_id(p) for (p, _), found in zip(ready, outcomes) if NEW in found}
    lines.drop(sorted(set(recorded) - taken))
    return outcomes
