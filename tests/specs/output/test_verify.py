"""Verification rules, one row per reason code: the ids that trigger it, and nothing else.

Given a run whose template puts think-start in the prompt (or, for the
`missing_think_start` row, one whose model emits it), when a finished
generation is verified, then the first failing rule names it.
"""
from __future__ import annotations

import pytest

from contract.names import VERIFY_RULES, Reason, Thinking
from contract.run.spec import RunSpec
from workers.output.verify import verify

START, END, EOS = 128821, 128822, 1
STOP = {"type": "stop", "matched": EOS}


def spec(thinking: str = Thinking.PROMPT, disabled: tuple[str, ...] = ()) -> RunSpec:
    return RunSpec(name="r", tokenizer="t", tokenizer_fingerprint="f", template_fingerprint="g",
                   sampling={"max_new_tokens": 64}, thinking=thinking, think_start_id=START,
                   think_end_id=END, stop_ids=[EOS], disabled_rules=list(disabled))


def meta(output: list[int], finish=STOP, prompt_tokens: int = 5, **extra) -> dict:
    return {"finish_reason": finish, "completion_tokens": len(output), "prompt_tokens": prompt_tokens, **extra}


GOOD = [11, 12, END, 21, 22, EOS]
RULES = [
    # reason, output ids, meta_info, thinking
    (Reason.ABORTED, GOOD, meta(GOOD, {"type": "abort", "message": "Abort in waiting queue"}), Thinking.PROMPT),
    (Reason.TRUNCATED, [11, 12, 13], meta([11, 12, 13], {"type": "length", "length": 3}), Thinking.PROMPT),
    (Reason.UNEXPECTED_FINISH, GOOD, meta(GOOD, None), Thinking.PROMPT),
    (Reason.TOKEN_COUNT_MISMATCH, GOOD, {**meta(GOOD), "completion_tokens": 7}, Thinking.PROMPT),
    (Reason.TOKEN_COUNT_MISMATCH, GOOD, meta(GOOD, prompt_tokens=4), Thinking.PROMPT),
    (Reason.THINK_START_IN_OUTPUT, [START, 11, END, 21, EOS], meta([START, 11, END, 21, EOS]), Thinking.PROMPT),
    (Reason.MISSING_THINK_START, GOOD, meta(GOOD), Thinking.OUTPUT),
    (Reason.MISSING_THINK_END, [11, 12, 21, EOS], meta([11, 12, 21, EOS]), Thinking.PROMPT),
    (Reason.MULTIPLE_THINK_END, [11, END, 12, END, 21, EOS], meta([11, END, 12, END, 21, EOS]), Thinking.PROMPT),
    (Reason.EMPTY_REASONING, [END, 21, EOS], meta([END, 21, EOS]), Thinking.PROMPT),
    (Reason.EMPTY_ANSWER, [11, END, EOS], meta([11, END, EOS]), Thinking.PROMPT),
]


@pytest.mark.parametrize("reason, output, info, thinking", RULES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_each_rule_names_its_reason(reason, output, info, thinking):
    verdict = verify(output, info, 5, spec(thinking))
    assert verdict.reason == reason and verdict.message


def test_every_verification_rule_has_a_row():
    assert {r[0] for r in RULES} == set(VERIFY_RULES)


@pytest.mark.parametrize("thinking, output", [
    (Thinking.PROMPT, GOOD),
    (Thinking.OUTPUT, [START] + GOOD),
    (Thinking.OFF, [21, 22, EOS]),
])
def test_a_good_generation_passes_and_says_where_think_end_is(thinking, output):
    verdict = verify(output, meta(output), 5, spec(thinking))
    assert verdict.ok
    assert verdict.think_end_pos == (output.index(END) if END in output else None)


# What each row of RULES is found to be with its own rule disabled: it passes, except the truncated
# output, which has no think-end either.
WHEN_DISABLED = [None, Reason.MISSING_THINK_END, None, None, None, None, None, None, None, None, None]


@pytest.mark.parametrize("reason, output, info, thinking, expected", [(*r, e) for r, e in zip(RULES, WHEN_DISABLED, strict=True)],
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_a_disabled_rule_lets_its_failure_through(reason, output, info, thinking, expected):
    verdict = verify(output, info, 5, spec(thinking, disabled=(reason,)))
    assert verdict.reason == expected and verdict.ok == (expected is None)


def test_the_answer_may_end_on_the_stop_token_the_server_matched():
    output = [11, END, 21, 99]
    assert verify(output, meta(output, {"type": "stop", "matched": 99}), 5, spec()).ok
    assert verify([11, END, 99], meta([11, END, 99], {"type": "stop", "matched": 99}), 5,
                  spec()).reason == Reason.EMPTY_ANSWER
