"""Intakes of tasks that start together go to Redis together: one round trip, not one each.

kombu takes messages in groups (the take that refills the prefetch after a
group commit's acknowledgements takes as many as that commit freed), so their
tasks start within moments of each other, each with its intake (`Ledger.intake`:
one script that reads the prompt's ids and notes its delivery). A round trip
costs Redis far more than that script (~60 us of CPU against ~20 on the bench
machine: `python -m bench --parts fleet`), so the intakes asked together go
in one round trip. Those asked while one is on its way wait, and the next
round trip carries them all (a busy worker's batches form so, and go at once).
An intake that finds none waiting beside it waits up to `LINGER` for the
tasks its take started with it (kombu hands a take's messages to the task
threads one after another, a fraction of a millisecond apart: at a node's two
samples a second, the five of a group commit's take), then carries every
intake asked by then: late by `LINGER` at most, against a generation of
seconds. One batcher per client (`for_client`): a worker's tasks share its one
client, so a batch holds only its own worker's intakes.

Nothing about one intake changes. Its task lists the prompt as held before it
asks (`STARTED.taking`), so its note is still written after that; it gets its
own script's reply or its own script's error; a batch that fails as a whole
(the connection, a failover) fails each of its intakes, and each task goes on
as it did when its own call failed. Where the primary has replicas, the batch
goes with one barrier and `WAIT` (`replication.confirmed`), confirmed as one
intake was; a failover met on the way is met by each of its intakes, each then
made again on its own (`confirmed_intake.again`).
"""
from __future__ import annotations

import copy
import threading
import time
import weakref
from dataclasses import dataclass

import redis

from contract.ledger.ledger import Intake, Ledger
from contract.redis_link.replication import confirmed, expected

LINGER = 0.005  # seconds an intake with none beside it waits for the ones its take started with it


@dataclass
class _Ask:
    """One task's intake: what it asks, and once sent, its reply or its error."""
    run: str
    prompt_id: str
    worker: str
    most: int
    reply: Intake | None = None
    error: BaseException | None = None
    done: bool = False


class GroupIntake:
    """The intakes of one client's tasks, sent a batch at a time (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._asked: list[_Ask] = []
        self._sending = False

    def take(self, client: redis.Redis, run: str, prompt_id: str, worker: str, most: int) -> Intake:
        """`Ledger.intake` of the prompt (its delivery to `worker` noted unless `most` are noted
        already), sent with the intakes asked while the one before was on its way."""
        ask = _Ask(run, prompt_id, worker, most)
        with self._cond:
            self._asked.append(ask)
            while self._sending and not ask.done:
                self._cond.wait()
            batch = None
            if not ask.done:  # no round trip on its way: this one carries every intake asked
                self._sending = True
                if len(self._asked) == 1:  # alone: the tasks its take started with it ask in a moment
                    deadline = time.monotonic() + LINGER
                    while (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)  # the lock is free meanwhile: others add their asks
                batch, self._asked = self._asked, []
        if batch is not None:
            try:
                _send(client, batch)
            finally:
                with self._cond:
                    for cut in batch:  # only where the sending thread itself was cut short
                        if not cut.done:
                            cut.error, cut.done = RuntimeError("the intake's batch was cut short"), True
                    self._sending = False
                    self._cond.notify_all()
        if ask.error is not None:
            raise ask.error
        assert ask.reply is not None
        return ask.reply


def _send(client: redis.Redis, batch: list[_Ask]) -> None:
    """One round trip for the batch; each ask gets its reply or error. A lone intake on a plain
    Redis is the one script call it always was."""
    try:
        if len(batch) == 1 and not expected(client):
            ask = batch[0]
            ask.reply, ask.done = Ledger(client, ask.run).intake(ask.prompt_id, ask.worker, ask.most), True
            return
        replies = _round_trip(client, batch)
    except Exception as exc:  # the batch as a whole: each of its tasks meets it
        for n, ask in enumerate(batch):
            ask.error, ask.done = exc if n == 0 else copy.copy(exc), True
        return
    for ask, reply in zip(batch, replies):
        if isinstance(reply, Exception):
            ask.error = reply
        else:
            ask.reply = Intake.read(reply)
        ask.done = True


def _round_trip(client: redis.Redis, batch: list[_Ask]) -> list:
    """The batch's script replies, in one pipeline: confirmed on a replica where the primary has
    replicas (`replication.confirmed`: its barrier and WAIT in the same round trip)."""
    def fill(pipe) -> None:
        for ask in batch:
            Ledger(client, ask.run).intake(ask.prompt_id, ask.worker, ask.most, pipe)

    if expected(client):
        return confirmed(client, fill)
    with client.pipeline(transaction=False) as pipe:
        fill(pipe)
        return pipe.execute(raise_on_error=False)


_BATCHERS: "weakref.WeakKeyDictionary[redis.Redis, GroupIntake]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def for_client(client: redis.Redis) -> GroupIntake:
    """The batcher of `client`'s intakes (one per client, as long as the client lives)."""
    with _LOCK:
        found = _BATCHERS.get(client)
        if found is None:
            found = _BATCHERS[client] = GroupIntake()
        return found
