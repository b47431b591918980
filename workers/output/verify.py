"""Think-structure verification by token id, one stable reason code per rule.

A drafter trained on a sequence learns every token of it, so a generation is
kept only if its structure is exactly what the model produces when all goes
well. Text is never inspected: the ids are what the model saw and produced.
"""
from __future__ import annotations

from dataclasses import dataclass

from contract.names import Reason, Thinking
from contract.run.spec import RunSpec

ABORTED, TRUNCATED, UNEXPECTED_FINISH = Reason.ABORTED, Reason.TRUNCATED, Reason.UNEXPECTED_FINISH
TOKEN_COUNT_MISMATCH = Reason.TOKEN_COUNT_MISMATCH
THINK_START_IN_OUTPUT, MISSING_THINK_START = Reason.THINK_START_IN_OUTPUT, Reason.MISSING_THINK_START
MISSING_THINK_END, MULTIPLE_THINK_END = Reason.MISSING_THINK_END, Reason.MULTIPLE_THINK_END
EMPTY_REASONING, EMPTY_ANSWER = Reason.EMPTY_REASONING, Reason.EMPTY_ANSWER


@dataclass(frozen=True)
class Verdict:
    reason: str | None          # None when the generation is good
    message: str = ""
    think_end_pos: int | None = None  # index of think-end within output_ids

    @property
    def ok(self) -> bool:
        return self.reason is None


def verify(output_ids: list[int], meta_info: dict, prompt_len: int, spec: RunSpec) -> Verdict:
    """Check one finished generation against the run's policy."""
    off = set(spec.disabled_rules)
    for check in (_finish, _counts):
        verdict = check(output_ids, meta_info, prompt_len)
        if verdict and verdict.reason not in off:
            return verdict
    if spec.thinking == Thinking.OFF:
        return Verdict(None)
    return _think(output_ids, meta_info, spec, off)


def _finish(output_ids: list[int], meta: dict, _prompt_len: int) -> Verdict | None:
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort":
        return Verdict(ABORTED, f"server aborted the request: {finish.get('message')!r}")
    if kind == "length":
        return Verdict(TRUNCATED, f"hit max_new_tokens ({finish.get('length')}) before a stop token")
    if kind != "stop":
        return Verdict(UNEXPECTED_FINISH, f"finish_reason {finish!r} is not a stop")
    return None


def _counts(output_ids: list[int], meta: dict, prompt_len: int) -> Verdict | None:
    completion, prompt = meta.get("completion_tokens"), meta.get("prompt_tokens")
    if completion is not None and completion != len(output_ids):
        return Verdict(TOKEN_COUNT_MISMATCH,
                       f"completion_tokens={completion} but {len(output_ids)} output_ids")
    if prompt is not None and prompt != prompt_len:
        return Verdict(TOKEN_COUNT_MISMATCH,
                       f"server saw prompt_tokens={prompt} but {prompt_len} were sent")
    return None


def _think(output_ids: list[int], meta: dict, spec: RunSpec, off: set[str]) -> Verdict:
    start_id, end_id = spec.think_start_id, spec.think_end_id
    body_start = 0
    failures: list[Verdict] = []
    starts = [i for i, t in enumerate(output_ids) if t == start_id]
    if spec.thinking == Thinking.OUTPUT:
        if not starts or starts[0] != 0:
            failures.append(Verdict(MISSING_THINK_START, "output does not begin with think-start"))
        else:
            starts, body_start = starts[1:], 1
    if starts:
        failures.append(Verdict(THINK_START_IN_OUTPUT,
                                f"think-start id {start_id} at output position(s) {starts[:8]}"))
    ends = [i for i, t in enumerate(output_ids) if t == end_id]
    if not ends:
        failures.append(Verdict(MISSING_THINK_END, f"no think-end id {end_id} in the output"))
    elif len(ends) > 1:
        failures.append(Verdict(MULTIPLE_THINK_END, f"think-end at output positions {ends[:8]}"))
    else:
        end = ends[0]
        answer = _strip_stop(output_ids[end + 1:], meta, spec)
        if end == body_start:
            failures.append(Verdict(EMPTY_REASONING, "nothing between the reasoning start and think-end"))
        elif not answer:
            failures.append(Verdict(EMPTY_ANSWER, "nothing but a stop token after think-end"))
    for verdict in failures:
        if verdict.reason not in off:
            return verdict
    return Verdict(None, think_end_pos=ends[0] if len(ends) == 1 else None)


def _strip_stop(tail: list[int], meta: dict, spec: RunSpec) -> list[int]:
    finish = meta.get("finish_reason") or {}
    matched = finish.get("matched") if isinstance(finish, dict) else None
    stops = set(spec.stop_ids) | ({matched} if isinstance(matched, int) else set())
    while tail and tail[-1] in stops:
        tail = tail[:-1]
    return tail


def think_positions(output_ids: list[int], spec: RunSpec) -> dict:
    """Where the think tokens are, for a dead letter's excerpt."""
    return {
        "think_start": [i for i, t in enumerate(output_ids) if t == spec.think_start_id][:16],
        "think_end": [i for i, t in enumerate(output_ids) if t == spec.think_end_id][:16],
    }
