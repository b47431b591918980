"""Which answers pass: the verifiers `enqueue --verify NAME` names, and each one's check.

A run made for rejection sampling wants to know, for every sample, whether its
answer is right. The producer names the check once for the run (its spec's
`verify`); a worker runs it on each stored sample's answer and writes the
result beside the sample (`verified`, `verdict`), so the counts are known while
the run goes on, and `export --verified-only` keeps the passing ones.

NAME is one of:

- `math`: the answer's last `\\boxed{...}` against the line's `answer` field,
  both read and compared by `math-verify` (HuggingFace's maintained checker:
  `0.5`, `1/2` and `\\frac{1}{2}` are equal). No `\\boxed{}` in the answer fails
  with the label `no_boxed`.
- `exact`: the answer, stripped, equals the line's `answer` field (as a
  string), stripped.
- `regex:PATTERN`: passes where `re.search(PATTERN, answer)` finds a match
  (Python's `re`, default flags: use `(?s)`, `(?i)` inside PATTERN for others).
- `module:function`: a user's own check, imported on the worker (and, at
  enqueue, on the producer, to refuse a typo there rather than in every
  sample): `function(fields, answer)`, where `fields` is the line's own
  fields (all but its messages) and `answer` the decoded answer. It returns a
  bool (the label is then `pass` or `fail`) or `(bool, label)`, a short label
  kept as the sample's verdict.

The *answer* is the output after the think-end token without its final stop
token, decoded and stripped (the whole output where the run does not think).

A check that raises gives `error: <what>` (a line without `answer` for the
built-ins that read it: `error: no_answer`); the worker also turns a check
that outlasts its time limit, or kills its process, into an `error: ...`
verdict (`workers/output/verdicts.py`). Every verdict falls in one of three
classes (`verdict_class`): pass, fail, error; the ledger counts samples by class.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Callable

BUILT_INS = ("math", "exact")
REGEX = "regex:"
PASS, FAIL, ERROR = "pass", "fail", "error"
CLASSES = (PASS, FAIL, ERROR)
MAX_LABEL = 64    # a function's own label, cut to this many characters
MAX_ERROR = 160   # an error verdict, cut to this many characters


class BadVerifier(ValueError):
    """A NAME that names no verifier (refused at enqueue, exit 2)."""


class CheckError(Exception):
    """A check cannot judge this sample (its line lacks what it needs): verdict `error: <message>`."""


@dataclass(frozen=True)
class Verifier:
    name: str     # as given to --verify
    kind: str     # math | exact | regex | function
    target: str = ""  # the pattern, or "module:function"


def parse_name(name: str) -> Verifier:
    """The verifier NAME names; raises `BadVerifier` for an unknown built-in, a pattern `re`
    refuses, or a `module:function` of the wrong shape (importing it is `check_importable`)."""
    if name in BUILT_INS:
        return Verifier(name, name)
    if name.startswith(REGEX):
        pattern = name[len(REGEX):]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadVerifier(f"--verify {name!r}: the pattern is not a regular expression: {exc}") from None
        return Verifier(name, "regex", pattern)
    module, sep, function = name.partition(":")
    if sep and _dotted(module) and function.isidentifier():
        return Verifier(name, "function", name)
    raise BadVerifier(f"--verify {name!r} names no verifier: use math, exact, regex:PATTERN or "
                      f"module:function (a function importable on the workers)")


def _dotted(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def load_function(target: str) -> Callable:
    """The user's function of `module:function`; raises `BadVerifier` if it cannot be had."""
    module, _, function = target.partition(":")
    try:
        found = getattr(importlib.import_module(module), function)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure on import
        raise BadVerifier(f"--verify {target!r}: cannot import {function} from {module} "
                          f"({exc.__class__.__name__}: {exc})"[:500]) from None
    if not callable(found):
        raise BadVerifier(f"--verify {target!r}: {module}.{function} is not callable")
    return found


def check_importable(verifier: Verifier) -> None:
    """At enqueue: a user's function must import here (and must on every worker too)."""
    if verifier.kind == "function":
        load_function(verifier.target)


def judge(verifier: Verifier, fields: dict, answer: str) -> tuple[bool, str]:
    """(passed, verdict) of one answer; raises whatever the check raises (the caller turns it
    into an `error` verdict: `error_verdict`)."""
    if verifier.kind == "exact":
        expected = str(_answer_field(fields)).strip()
        return (True, PASS) if answer.strip() == expected else (False, FAIL)
    if verifier.kind == "regex":
        return (True, PASS) if re.search(verifier.target, answer) else (False, FAIL)
    if verifier.kind == "math":
        return _math(fields, answer)
    return _own(load_function(verifier.target)(fields, answer))


def error_verdict(what: str) -> str:
    """The verdict of a check that could not judge: `error: <what>`, kept short."""
    return f"{ERROR}: {what}"[:MAX_ERROR]


def verdict_class(verified: bool | None, verdict: str | None) -> str | None:
    """pass, fail or error (None: no verifier): a verdict `error` or `error: ...` is an error,
    else the sample passed or failed by `verified`, whatever its label."""
    if verdict is None:
        return None
    if verdict == ERROR or verdict.startswith(ERROR + ":"):
        return ERROR
    return PASS if verified else FAIL


def _answer_field(fields: dict):
    value = fields.get("answer")
    if value is None:
        raise CheckError("no_answer")
    return value


def _own(result) -> tuple[bool, str]:
    """A user's function's return: a bool, or (bool, label)."""
    if isinstance(result, bool):
        return result, PASS if result else FAIL
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        label = str(result[1]).strip()[:MAX_LABEL] or (PASS if result[0] else FAIL)
        if result[0] and verdict_class(True, label) == ERROR:  # a passing sample is never an error
            label = PASS
        elif not result[0] and label == PASS:  # nor a failing one labelled pass
            label = FAIL
        return result[0], label
    raise CheckError(f"the verifier returned {type(result).__name__}, not a bool or (bool, label)")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None  # never closed


def _math(fields: dict, answer: str) -> tuple[bool, str]:
    from math_verify import parse, verify  # the worker extra's; imported where a math check runs

    expected = str(_answer_field(fields))
    boxed = last_boxed(answer)
    if boxed is None:
        return False, "no_boxed"
    gold = parse(expected) or parse(f"${expected}$")
    if not gold:
        raise CheckError("answer field not readable as math")
    return (True, PASS) if verify(gold, parse(f"\\boxed{{{boxed}}}")) else (False, FAIL)
