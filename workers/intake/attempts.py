"""What happened to one prompt so far, and the ways its request loop ends without an answer.

`Attempts` travels with a prompt through its requests (`request_loop.py`) into its sample's
`attempts` column or its dead letter (`burial.py`). Its `total` counts the requests sent, the one
answered included, one entry each (`servers`, repeats kept); a request cut because its server was
marked down while it waited, a gateway's answer that no server can take it, and a one-token probe
are taken off it. Budgets are counted apart (`transient`, `unavailable`): an answer that an
earlier request of the prompt still runs there adds to `total` but spends neither. The exceptions are how the loop
says the prompt leaves it otherwise: back to the queue untouched (`GiveBack`), already settled
by another worker (`SettledElsewhere`), or as a dead letter (`Unfit`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from contract.ledger.deadletters import DeadLetter


class GiveBack(Exception):
    """The prompt goes back to the queue untouched: no healthy server came free, the storage
    fails, or the worker is shutting down."""


class SettledElsewhere(Exception):
    """While this worker waited for an earlier request of the prompt still running on its server,
    another worker settled the prompt (its args: the state, done or dead): nothing is sent again."""


class Unfit(Exception):
    """The prompt ends as this dead letter (raised out of the request loop, buried by its caller)."""

    def __init__(self, letter: DeadLetter):
        super().__init__(f"{letter.reason}: {letter.message}")
        self.letter = letter


@dataclass
class Attempts:
    """What happened to one prompt so far, for its sample or dead letter."""
    transient: int = 0
    unavailable: int = 0
    refused: int = 0
    cut: int = 0  # requests ended because their server was marked down: not attempts
    last_bad_output: dict | None = None  # the excerpt, when the last failure was a bad answer
    resampled: bool = False
    crashes: list[dict] = field(default_factory=list)  # server crashes it was in flight at (server_crashes.py)
    probed: bool = False  # sent alone as a one-token probe since its last crash note, and answered
    alone: bool = False   # the request in flight is a crash suspect's, sent alone
    servers: list[str] = field(default_factory=list)
    last_error: str = ""
    started_at: float = field(default_factory=time.time)
    in_flight_since: float | None = None  # monotonic: the first answer that an earlier request still runs

    @property
    def total(self) -> int:
        return len(self.servers)

