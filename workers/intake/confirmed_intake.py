"""Behind a primary with replicas, a prompt is generated only once its delivery's note is on a replica.

A worker learns of a failover only at its watch's next question to the
Sentinels (`failover.py`); after a `SENTINEL FAILOVER` the old primary takes
writes until the Sentinels demote it. A message the worker takes there in that
last second may still be queued on the new primary (its pop never replicated),
where a worker that moved first takes it again. That worker's intake reads the
delivery notes to learn who generates the prompt (`deliveries.elsewhere`), so a
note written to the old primary only is no note: both would generate.

So where the primary has replicas (`replication.expected`), the intake goes
with its barrier and `WAIT` in one round trip (`replication.confirmed`), and
the prompt is generated only once a replica has its note. The replication
stream is ordered: the replica then also has kombu's take of the message,
which is therefore off the new primary's queue. A barrier that reaches fewer
replicas than the primary had, on a primary the Sentinels no longer name, is
`FailedOver`: nothing was generated yet, and the intake is made again on the
new primary, where the notes decide who generates, as for any two messages of
one prompt (the first noted among live workers; `deliveries.elsewhere`). The
message this worker took is then either back in the new primary's queue
(whoever takes it finds this worker's note and acknowledges it) or, if its
take replicated, held under this worker's tag there.

The intake made again may find this delivery's first note there (it reached
the replica but was not confirmed before the promotion): the new note is
taken back (one delivery, one note), and only the names before that first
note decide, since every worker noted after it found it and this worker
listed as holding the prompt (`after_failover`).

A primary without replicas (a plain single Redis) pays nothing more: the
intake stays its one script call, as before. Either way the intakes of tasks
that start together share their round trip (`group_intake`).
"""
from __future__ import annotations

from itertools import chain, repeat

import redis

from contract.ledger.ledger import Intake, Ledger
from contract.redis_link.replication import confirmed, expected, written_again

from . import deliveries, group_intake


def take(client: redis.Redis, run: str, prompt_id: str, worker: str, most: int) -> Intake:
    """The prompt's intake, noting its delivery to `worker` unless `most` are noted already
    (`Ledger.intake`), sent with the intakes of the tasks that start with it (`group_intake`);
    where the primary has replicas, returned only once a replica has the note, and made again
    on the new primary after a failover (`replication.written_again`)."""
    first = group_intake.for_client(client).take
    if not expected(client):
        return first(client, run, prompt_id, worker, most)
    tries = chain([first], repeat(again))  # the first on the primary of the moment, then `again`
    return written_again(lambda: next(tries)(client, run, prompt_id, worker, most),
                         f"the intake of prompt {prompt_id} of run {run}")


def again(client: redis.Redis, run: str, prompt_id: str, worker: str, most: int) -> Intake:
    """The intake made again on the new primary after a failover: where this delivery's first
    note is there already, the new one is taken back and only the names before the first decide
    (`after_failover`)."""
    intake = _confirmed(client, run, prompt_id, worker, most)
    held_by, seen = after_failover(intake.held_by, worker)
    if not seen:
        return intake
    if intake.noted:
        deliveries.undo(client, run, prompt_id, worker)  # its first note stands for it
    return intake._replace(held_by=held_by, noted=True)


def after_failover(held_by: list[str], worker: str) -> tuple[list[str], bool]:
    """An intake made again on a new primary: the names that decide who generates (those noted
    before this delivery's first note, if that note is there: any later one found it and this
    worker holding the prompt), and whether it is there. (A note of a predecessor under this
    worker's name reads the same: at worst its death is counted once less.)"""
    if worker not in held_by:
        return held_by, False
    last = len(held_by) - 1 - held_by[::-1].index(worker)
    return held_by[:last], True


def _confirmed(client: redis.Redis, run: str, prompt_id: str, worker: str, most: int) -> Intake:
    """The intake with its barrier and WAIT, one round trip (`replication.confirmed`)."""
    [reply] = confirmed(client, lambda pipe: Ledger(client, run).intake(prompt_id, worker, most, pipe))
    return Intake.read(reply)
