"""The figures of a run's dead letters, one letter at a time.

Per reason: a count, when they died (seconds since the run began, in a
`FoldingGrid` per reason) and the few smallest ids as examples. A dead letter
that carries a generation (its `excerpt`) also says how that generation
finished and how many think-end tokens it held, so finish reasons and think
closure cover every generation, stored or not.
"""
from __future__ import annotations

from collections import Counter

from contract.ledger.deadletters import DeadLetter
from contract.run.spec import RunSpec

from .samples import EXAMPLES, TIME_CELLS
from .tally import FoldingGrid, Picks

NO_GENERATION = "no generation"


class LetterTally:
    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.reasons: Counter = Counter()
        self.timelines: dict[str, FoldingGrid] = {}
        self.picks: dict[str, Picks] = {}
        self.finish: Counter = Counter()
        self.closure: Counter = Counter()
        self.prompt_tokens = 0

    def add(self, letter: DeadLetter) -> None:
        reason = letter.reason
        self.reasons[reason] += 1
        self.prompt_tokens += letter.prompt_tokens
        since = max(0.0, letter.dead_at - self.spec.created_at)
        self.timelines.setdefault(reason, FoldingGrid(1, (1.0,), TIME_CELLS)).add(([since],))
        self.picks.setdefault(reason, Picks(EXAMPLES)).offer(0, letter.key)
        self.finish[finish_type(letter.excerpt)] += 1
        self.closure[closure(letter.excerpt)] += 1


def finish_type(excerpt: dict) -> str:
    if not excerpt:
        return NO_GENERATION
    finish = excerpt.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    return str(kind) if kind else "none"


def closure(excerpt: dict) -> str:
    """'one', 'none' or 'several' think-end tokens in the generation (its first 16 are kept)."""
    if not excerpt:
        return NO_GENERATION
    ends = len(excerpt.get("think_end") or [])
    return "one" if ends == 1 else "none" if ends == 0 else "several"
