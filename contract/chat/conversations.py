"""Regenerating a conversation turn by turn: which history each turn's prompt renders.

A conversation (`enqueue --turns all`) is read into a *skeleton*: its messages
as given, each original assistant answer replaced by a slot (`{"slot": i}`)
for the model's own answer i, or dropped. The slots:

- the messages are grouped at each user message (a group: one user message and
  what follows it up to the next user message);
- a group that holds an assistant message after its user message gets one
  slot, where the first such message was; its other assistant messages (and
  any before the first user message) are dropped;
- the last group always gets a slot (at its first assistant message, else at
  its end), so a conversation that ends on a user message is answered too;
- a middle group without an assistant message gets none (consecutive user
  messages stay consecutive).

System, tool and any other non-user messages are kept as given, in place.
Turn k's prompt renders the skeleton up to slot k, with slot i < k filled by
the model's answer to turn i (`answer_message`), the way a client sends a
served model's answer back: `content` is the answer after think-end and
`reasoning_content` the reasoning, both stripped as SGLang's reasoning parser
returns them. A template that drops the reasoning of earlier turns
(DeepSeek-R1 splits at `</think>`, Qwen3 keeps `reasoning_content` only after
the last user message, Kimi likewise) drops it; one that ignores
`reasoning_content` (the bundled R1-style template) renders the answer alone.
So the history a turn sees is the one a server would render when serving that
conversation, and the rule is the same in the producer (turn 0) and in a
worker (every later turn): both call `turn_history`.

A turn's prompt id is `<conversation id>#<turn>` (`turn_id`).
"""
from __future__ import annotations

from typing import Callable, Sequence

SEPARATOR = "#"
LAST, ALL = "last", "all"  # `enqueue --turns`: today's one generation, or every assistant turn


def turn_id(conversation: str, turn: int) -> str:
    return f"{conversation}{SEPARATOR}{turn}"


def split_turn_id(prompt_id: str) -> tuple[str, int]:
    """(conversation id, turn) of a turn's prompt id."""
    conversation, _, turn = prompt_id.rpartition(SEPARATOR)
    if not conversation or not turn.isdigit():
        raise ValueError(f"{prompt_id!r} is not a turn id (<conversation>{SEPARATOR}<turn>)")
    return conversation, int(turn)


def skeleton(messages: list[dict]) -> list[dict]:
    """The conversation with each regenerated answer's place a `{"slot": i}` (module docstring)."""
    groups: list[list[dict]] = [[]]
    for message in messages:
        if message["role"] == "user" and any(m["role"] == "user" for m in groups[-1]):
            groups.append([])
        groups[-1].append(message)
    out: list[dict] = []
    slot = 0
    for index, group in enumerate(groups):
        user = next((i for i, m in enumerate(group) if m["role"] == "user"), None)
        answered = user is not None and any(m["role"] == "assistant" for m in group[user:])
        wants_slot = user is not None and (answered or index == len(groups) - 1)
        placed = False
        for position, message in enumerate(group):
            if message["role"] != "assistant":
                out.append(dict(message))
            elif wants_slot and not placed and position > user:
                out.append({"slot": slot})
                slot, placed = slot + 1, True
        if wants_slot and not placed:
            out.append({"slot": slot})
            slot += 1
    return out


def turns(shape: list[dict]) -> int:
    """How many assistant turns a skeleton regenerates."""
    return sum(1 for m in shape if "slot" in m)


def turn_history(shape: list[dict], answers: Sequence[dict], turn: int) -> list[dict]:
    """The messages turn `turn` renders: the skeleton up to its slot, earlier slots filled."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs {turn} earlier answers, got {len(answers)}")
    history = []
    for message in shape:
        if "slot" not in message:
            history.append(message)
        elif message["slot"] < turn:
            history.append(answers[message["slot"]])
        else:
            return history
    raise ValueError(f"the conversation has no turn {turn}")


def answer_message(output_ids: Sequence[int], think_start_id: int | None, think_end_id: int | None,
                   stop_ids: Sequence[int], decode: Callable[[list[int]], str]) -> dict:
    """A generated turn as the assistant message later turns' history holds: the output
    without its final stop token, split at think-end into `reasoning_content` (without a
    think-start the model emitted) and `content`, each stripped."""
    ids = list(output_ids)
    if ids and ids[-1] in stop_ids:
        ids.pop()
    if think_end_id is not None and think_end_id in ids:
        end = ids.index(think_end_id)
        reasoning, answer = ids[:end], ids[end + 1:]
        if reasoning[:1] == [think_start_id]:
            reasoning = reasoning[1:]
        return {"role": "assistant", "content": decode(answer).strip(),
                "reasoning_content": decode(reasoning).strip()}
    return {"role": "assistant", "content": decode(ids).strip()}
