"""`export --format text`: JSONL of decoded rows, for reading and for trainers that re-render.

Each line: `id`, `sample` (the sample's index among its prompt's, `enqueue
--samples`; 0 in a run of one), `conversation`, `turn`, `prompt` (the prompt ids decoded with
special tokens kept: exactly what the template rendered, history included),
`messages`, `finish_reason`, `prompt_tokens`, `output_tokens`. `messages` ends with
the generated answer as an assistant message: the output without its final stop
token, split at the think-end token into `content` (after it) and
`reasoning_content` (before it, without a think-start the model emitted), each
stripped, the way a server's reasoning parser returns them; without a think-end
token the whole output is `content`. The shards hold token ids, not the input's
messages, so the system and user messages before it come from the input file
(`export --prompts FILE`, read as `enqueue` reads it) for a single prompt whose id
it holds; otherwise (no file, or a conversation turn, whose history is in
`prompt`) `messages` holds the answer alone. Decoding needs the run's tokenizer:
one whose fingerprint differs from the run's is refused, since its text would not
be what the model saw.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from contract.run.spec import RunSpec

from . import FormatRefused
from .rows import Row

FILE = "messages.jsonl"


def line_maker(spec: RunSpec, options: dict) -> Callable[[Row], str]:
    tok = _tokenizer(spec, bool(options.get("trust_remote_code")))
    given = _given_messages(options.get("prompts") or [])

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def line(row: Row) -> str:
        before = given.get(row.id, []) if row.conversation is None else []
        record = {"id": row.id, "sample": row.sample or 0, "conversation": row.conversation, "turn": row.turn,
                  "prompt": decode(row.prompt_ids), "messages": [*before, answer_message(row, spec, decode)],
                  "finish_reason": row.finish_reason, "prompt_tokens": row.prompt_len,
                  "output_tokens": len(row.input_ids) - row.prompt_len}
        return json.dumps(record, ensure_ascii=False)

    return line


def answer_message(row: Row, spec: RunSpec, decode: Callable[[list[int]], str]) -> dict:
    """The generated output as an assistant message (module docstring)."""
    output = row.output_ids
    if row.stop_token is not None and output and output[-1] == row.stop_token:
        output = output[:-1]
    end = None if row.think_end_index is None else row.think_end_index - row.prompt_len
    if end is None or not 0 <= end < len(output):
        return {"role": "assistant", "content": decode(output).strip()}
    reasoning, answer = output[:end], output[end + 1:]
    if reasoning[:1] == [spec.think_start_id]:
        reasoning = reasoning[1:]
    return {"role": "assistant", "content": decode(answer).strip(), "reasoning_content": decode(reasoning).strip()}


def _tokenizer(spec: RunSpec, trust_remote_code: bool):
    from contract.chat.template import ChatTokenizer

    try:
        chat = ChatTokenizer(spec.tokenizer, trust_remote_code)
    except Exception as exc:  # a hub id out of reach, a path from another machine
        raise FormatRefused(f"the run's tokenizer {spec.tokenizer!r} did not load "
                            f"({type(exc).__name__}: {exc})") from exc
    if chat.fingerprint() != spec.tokenizer_fingerprint:
        raise FormatRefused(f"tokenizer {spec.tokenizer!r} here has fingerprint {chat.fingerprint()}, the run's "
                            f"is {spec.tokenizer_fingerprint}: its text would not be what the model saw")
    return chat.tok


def _given_messages(paths: list[Path]) -> dict[str, list[dict]]:
    """Each prompt's messages by id, from the input files (the first line of an id wins, as in enqueue)."""
    from producer.prompts import Prompt, read_prompts

    given: dict[str, list[dict]] = {}
    for path in paths:
        try:
            for item in read_prompts(Path(path)):
                if isinstance(item, Prompt):
                    given.setdefault(item.id, item.messages)
        except OSError as exc:
            raise FormatRefused(f"cannot read {path}: {exc}") from exc
    return given
