"""One stored sample, or one dead letter, decoded with its run's tokenizer.

`python -m producer show ID` finds the id among the run's shards with a
pyarrow dataset filter on `id` (pushed down to the Parquet reader, which skips
row groups whose id range cannot hold it), else among the dead letters, and
decodes it with the tokenizer the run's spec names: the prompt exactly as the
chat template rendered it, the reasoning and the answer split at the
think-end token *by id*, special tokens kept visible, token counts, and the
provenance columns. The ids are the truth; the text is only their decoding,
so `--ids` lists every id beside its piece of text. The report embeds the
same rendering for its example samples.

In a run of several samples a prompt a sample is named by its ledger key
(`<id>~<index>`, or `show ID --sample INDEX`): the shards are filtered on the
prompt's id and the rows matched by (`id`, `sample`) (`contract/run/samples.py`).
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field

import pyarrow.compute as pc

from contract.ledger.codec import b64_to_ids
from contract.ledger.deadletters import DeadLetter
from contract.run.samples import row_key, split_sample_key
from contract.storage.schema import COLUMNS, arrow_schema
from contract.run.spec import RunSpec

from contract.counts import counted

Segment = tuple[str, bool]  # (text, is a special token)


@dataclass
class Section:
    heading: str
    ids: list[int]
    start: int = 0            # position of the first id (in input_ids, or in the output)
    note: str = ""


@dataclass
class Shown:
    title: str
    fields: list[tuple[str, str]] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Decoder:
    """Token ids to text with special tokens kept, in segments that mark them; ids only without a tokenizer."""

    def __init__(self, tokenizer=None, problem: str = ""):
        self.tok, self.problem = tokenizer, problem
        self.special = set(tokenizer.added_tokens_decoder) if tokenizer is not None else set()

    def segments(self, ids: list[int]) -> list[Segment]:
        if self.tok is None:
            return [(" ".join(map(str, ids)), False)]
        out: list[Segment] = []
        run: list[int] = []
        for tid in ids:
            if tid in self.special:
                if run:
                    out.append((self._decode(run), False))
                    run = []
                out.append((self.tok.convert_ids_to_tokens(tid), True))
            else:
                run.append(tid)
        if run:
            out.append((self._decode(run), False))
        return out

    def piece(self, tid: int) -> str:
        return repr(self._decode([tid])) if self.tok is not None else ""

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def load_decoder(spec: RunSpec, trust_remote_code: bool = False) -> Decoder:
    """The run's tokenizer (`contract.chat.template.ChatTokenizer`, 'bundled' included), or ids only if it will not load."""
    from contract.chat.template import ChatTokenizer

    try:
        chat = ChatTokenizer(spec.tokenizer, trust_remote_code)
    except Exception as exc:  # a hub id out of reach, a path on another machine: still show the ids
        return Decoder(None, f"tokenizer {spec.tokenizer!r} did not load ({type(exc).__name__}: {exc}); ids only")
    decoder = Decoder(chat.tok)
    if chat.fingerprint() != spec.tokenizer_fingerprint:
        decoder.problem = (f"tokenizer {spec.tokenizer!r} here has fingerprint {chat.fingerprint()}, the run's is "
                           f"{spec.tokenizer_fingerprint}: the text may not be what the model saw")
    return decoder


def find_samples(output_dir: str, run: str, ids: list[str], samples: int = 1) -> dict[str, list[dict]]:
    """Every stored copy of each ledger key (a redelivered prompt can be stored twice), with its
    shard (`__filename`), read one shard at a time; `ids` are keys of a run of `samples` samples
    a prompt (its prompts' ids where it takes one)."""
    import pyarrow.parquet as pq

    from contract.storage import store_for

    store = store_for(output_dir)
    found: dict[str, list[dict]] = {}
    if not ids:
        return found
    wanted = set(ids)
    prompts = sorted({split_sample_key(key, samples)[0] for key in ids}) if samples > 1 else ids
    for location in store.shards(run):
        table = pq.read_table(store.source(location), schema=arrow_schema(), columns=list(COLUMNS),
                              filters=pc.field("id").isin(prompts))
        for row in table.to_pylist():
            key = row_key(row["id"], row["sample"], samples)
            if key in wanted:
                found.setdefault(key, []).append({**row, "__filename": location})
    return found


def sample_view(rows: list[dict], spec: RunSpec) -> Shown:
    row = rows[0]
    ids, prompt_len = row["input_ids"], row["prompt_len"]
    output = ids[prompt_len:]
    end = row["think_end_index"]
    several = spec.samples > 1
    which = f"sample {row['sample'] or 0} of prompt {row['id']}" if several else f"sample {row['id']}"
    shown = Shown(f"{which} (run {row['run']})" + (f", stored {len(rows):,} times" if len(rows) > 1 else ""))
    reasoning = (end - prompt_len) if end is not None else None
    answer = len(output) - reasoning - 1 if reasoning is not None else None
    shown.fields = [
        ("tokens", f"prompt {prompt_len:,}, output {len(output):,}"
         + (f" = reasoning {reasoning:,} + think-end 1 + answer {answer:,} (stop token included)" if end is not None
            else " (no think-end: not split)")),
        ("shard", str(row.get("__filename", ""))),
        *[(k, _text(row[k])) for k in ("finish_reason", "stop_token", "think_end_index", "server", "cached_tokens",
                                       "model", "worker", "attempts", "max_new_tokens", "temperature", "top_p",
                                       "top_k", "min_p", "e2e_latency", "started_at", "finished_at", "seed")],
        *_logprobs_field(row),
        ("tokenizer", f"{spec.tokenizer} (fingerprint {row['tokenizer_fingerprint']}"
         + ("" if row["tokenizer_fingerprint"] == spec.tokenizer_fingerprint else f", spec has {spec.tokenizer_fingerprint}")
         + ")"),
        ("template", f"fingerprint {row['template_fingerprint']}"
         + ("" if row["template_fingerprint"] == spec.template_fingerprint else f", spec has {spec.template_fingerprint}")),
    ]
    if row.get("verdict") is not None:  # a run with a verifier (enqueue --verify)
        shown.fields.append(("verdict", f"{row['verdict']} ({'passed' if row.get('verified') else 'not passed'} "
                                        f"{spec.verify or 'the verifier'})"))
    shown.sections.append(Section(f"prompt ({counted(prompt_len, 'token')}, as the chat template rendered it)", ids[:prompt_len]))
    if end is None:
        shown.sections.append(Section(f"output ({counted(len(output), 'token')}, no think-end)", output, prompt_len))
    else:
        shown.sections += [Section(f"reasoning ({counted(reasoning, 'token')}, before think-end)", ids[prompt_len:end], prompt_len),
                           Section(f"think-end (input position {end})", ids[end:end + 1], end),
                           Section(f"answer ({counted(answer, 'token')} after think-end, stop token included)", ids[end + 1:], end + 1)]
    return shown


def letter_view(letter: DeadLetter, spec: RunSpec) -> Shown:
    prompt = b64_to_ids(letter.prompt_b64)
    excerpt = letter.excerpt or {}
    which = letter.id if letter.sample is None else f"{letter.id}, sample {letter.sample}"
    shown = Shown(f"dead letter {which} (run {letter.run}): {letter.reason}")
    shown.fields = [("reason", letter.reason), ("message", letter.message), ("attempts", str(letter.attempts)),
                    ("servers", ", ".join(letter.servers)), ("worker", letter.worker),
                    ("tokens", f"prompt {letter.prompt_tokens:,}"
                     + (f", output {excerpt['output_len']:,} (only an excerpt is kept)" if "output_len" in excerpt else
                        ", no generation kept")),
                    ("sampling", _text(letter.sampling)), ("first attempt", _time(letter.first_attempt_at)),
                    ("dead at", _time(letter.dead_at))]
    shown.fields += [(f"excerpt {k}", _text(v)) for k, v in excerpt.items()
                     if k not in ("first_output_ids", "last_output_ids")]
    shown.sections.append(Section(f"prompt ({counted(len(prompt), 'token')}, as the chat template rendered it)", prompt))
    shown.sections += _excerpt_sections(excerpt)
    return shown


def _excerpt_sections(excerpt: dict) -> list[Section]:
    if "output_len" not in excerpt:
        return []
    n, first, last = excerpt["output_len"], excerpt.get("first_output_ids", []), excerpt.get("last_output_ids", [])
    if n <= len(last):
        return [Section(f"output (all {counted(n, 'token')})", last)]
    gap = n - len(first) - len(last)
    note = (f"{counted(gap, 'token')} between them not kept" if gap > 0
            else f"the two overlap by {counted(-gap, 'token')}")
    return [Section(f"output: first {counted(len(first), 'token')}", first),
            Section(f"output: last {counted(len(last), 'token')} (of {n:,}; {note})", last, n - len(last))]


def render_text(shown: Shown, decoder: Decoder, with_ids: bool = False, limit: int | None = None) -> str:
    """Plain text: the fields, then each section's decoded text (and, `with_ids`, one line per token)."""
    lines = [shown.title, *(f"! {w}" for w in shown.warnings + ([decoder.problem] if decoder.problem else []))]
    width = max((len(k) for k, _ in shown.fields), default=0)
    lines += [f"  {k:<{width}}  {v}" for k, v in shown.fields]
    for section in shown.sections:
        lines += ["", f"── {section.heading} ──"]
        lines.append("".join(text for text, _ in clipped_segments(section, decoder, limit)))
        if with_ids:
            lines += [f"  {section.start + i:>7}  {tid:>7}  {decoder.piece(tid)}" for i, tid in enumerate(section.ids)]
    return "\n".join(lines) + "\n"


def clipped_segments(section: Section, decoder: Decoder, limit: int | None) -> list[Segment]:
    """The section's segments; with a limit, its first and last limit/2 tokens and a note between."""
    ids = section.ids
    if limit is None or len(ids) <= limit:
        return decoder.segments(ids)
    half = limit // 2
    note = f"\n[… {len(ids) - 2 * half:,} tokens not shown here: python -m producer show prints them all …]\n"
    return decoder.segments(ids[:half]) + [(note, False)] + decoder.segments(ids[-half:])


def _logprobs_field(row: dict) -> list[tuple[str, str]]:
    """A `--logprobs K` row's log-probabilities in one line (the lists themselves are for trainers)."""
    chosen = row.get("logprobs")
    if not chosen:
        return []
    k = len(row.get("top_logprobs") or ()) // len(chosen)
    return [("logprobs", f"top {k} a token for {len(chosen):,} tokens; mean log-probability of the tokens "
                         f"{sum(chosen) / len(chosen):.4g}, lowest {min(chosen):.4g}")]


def _text(value) -> str:
    """A field's value as a user reads it: a mapping (a dead letter's sampling, its finish
    reason) as `key=value, ...` and a list comma-separated, in JSON's spelling (`false`, not
    Python's `False`), never a Python repr."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_scalar(item)}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(_scalar, value)) or "none"
    return "" if value is None else str(value)


def _scalar(value) -> str:
    return value if isinstance(value, str) else _text(value) if isinstance(value, float) else json.dumps(value)


def _time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="milliseconds") if epoch else ""
