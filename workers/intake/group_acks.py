"""A group commit acknowledges its samples' deliveries, in the round trip that marks them done.

kombu acknowledges each task's message on its own when the task returns (a
MULTI/ZREM/HDEL/EXEC transaction per message). A stored sample's task returns
only once its group commit has marked it done, so the commit can acknowledge
the whole group's messages itself, in the same pipeline, right after the done
marks (`reconcile.ShardBook.mark_done`, `contract/broker/kombu_take.py`): acknowledged
only once durable and done, as before, and kombu's own ack of such a message
then settles only the channel's memory (`kombu_redis.settled`).

A task lists its delivery here (`expect`) when it hands its sample over, and
takes it off when it returns (`drop`), however it ends: a sample withdrawn or
given back after a timeout is then no longer acknowledged by a later commit,
and its message goes back to the queue the ordinary way. A conversation's
turn is not listed: its task queues the next turn after the commit, and its
redelivery, should the worker die in between, is what moves the conversation on.
"""
from __future__ import annotations

import threading
from typing import Iterable


class GroupAcks:
    def __init__(self) -> None:
        self._tags: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def expect(self, run: str, prompt_id: str, tag: str) -> None:
        with self._lock:
            self._tags[(run, prompt_id)] = tag

    def drop(self, run: str, prompt_id: str, tag: str) -> None:
        with self._lock:
            if self._tags.get((run, prompt_id)) == tag:
                del self._tags[(run, prompt_id)]

    def claim(self, run: str, prompt_ids: Iterable[str]) -> list[str]:
        """The delivery tags of these prompts' tasks that still wait for their commit."""
        with self._lock:
            return [tag for tag in (self._tags.pop((run, pid), None) for pid in prompt_ids) if tag]


GROUP_ACKS = GroupAcks()
