"""Where each conversation of a run stands: the one owner of a run's conversation keys.

A conversation (`enqueue --turns all`) moves one turn at a time. Its turns are
prompts of the run's `Ledger` (id `<conversation>#<turn>`, `conversations.py`),
and the conversation itself is four small entries (`RunKeys.conversation_*`):
its number of turns (kept for the run's life), and while it is in progress its
skeleton, the turn it is at, and the answers of its stored turns. Two scripts
change them, each one atomic, conditional step:

    register   (none)  -> at 0       the producer, just before it enqueues turn 0
    advance    at k    -> at k + 1   turn k is done: its answer is kept and turn k+1
                                     becomes a queued prompt with its ids (or a dead one
                                     with its letter, when its history cannot be rendered)
    advance    at k    -> complete   turn k is the last and done: the in-progress
                                     entries go, the count of complete conversations grows

`advance` does nothing unless the conversation is at turn k and turn k is
done, so it is idempotent: a worker that stored turn k calls it, and so does
whoever finds turn k done with the conversation still at k (the redelivery of
turn k's message after a crash, the audit's sweep of conversations), and only
the first call moves the conversation; no turn is queued or generated twice.
A stopped conversation is one whose current turn is dead: it stays at that
turn, and `dead requeue` makes the turn queued again, which resumes it.

Counts, in the run's counters hash beside the ledger's: `conversations`,
`conversation_turns` (turns of the conversations registered) and
`conversations_complete`. A run of conversations holds only turns, so its
stopped conversations are its dead prompts and its turns are its prompts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from .codec import count_ids, pack_ids
from .keys import RunKeys
from .ledger import _PRELUDE, Ledger
from .conversations import turn_id

QUEUED_NEXT, BURIED_NEXT, COMPLETE = "queued", "buried", "complete"

# KEYS[B+1..B+4] (after the ledger's own): turns, shapes, at, answers. ARGV: conversation id, turns, skeleton JSON per
# conversation. Returns per conversation 1 (registered) or 0 (the run has it).
_REGISTER = _PRELUDE + """
local turns, shapes, at = KEYS[B + 1], KEYS[B + 2], KEYS[B + 3]
local out, fresh, total = {}, 0, 0
for i = 1, #ARGV / 3 do
  local a = 3 * i - 2
  out[i] = 0
  if redis.call('HSETNX', turns, ARGV[a], ARGV[a + 1]) == 1 then
    redis.call('HSET', shapes, ARGV[a], ARGV[a + 2])
    redis.call('HSET', at, ARGV[a], 0)
    fresh, total, out[i] = fresh + 1, total + tonumber(ARGV[a + 1]), 1
  end
end
if fresh > 0 then count('conversations', fresh) count('conversation_turns', total) end
return out
"""

# KEYS[B+1..B+4]: turns, shapes, at, answers; KEYS[B+5]: turn k's bucket; KEYS[B+6]: turn k+1's.
# ARGV: conversation, k, field k, id k, answer JSON, mode ('last' | 'queue' | 'bury'),
# then field k+1, id k+1, and the packed ids and token count ('queue') or reason and letter ('bury').
_ADVANCE = _PRELUDE + """
local shapes, at, answers = KEYS[B + 2], KEYS[B + 3], KEYS[B + 4]
local conv, k, mode = ARGV[1], ARGV[2], ARGV[6]
if redis.call('HGET', at, conv) ~= k then return 'stale' end
local found = kind(get(KEYS[B + 5], ARGV[3], ARGV[4]))
if found ~= 'done' then return found or '' end
if mode == 'last' then
  local fields = {}
  for i = 0, tonumber(k) - 1 do fields[#fields + 1] = conv .. '#' .. i end
  if #fields > 0 then redis.call('HDEL', answers, unpack(fields)) end
  redis.call('HDEL', shapes, conv)
  redis.call('HDEL', at, conv)
  count('conversations_complete', 1)
  return 'complete'
end
redis.call('HSET', answers, ARGV[4], ARGV[5])
redis.call('HSET', at, conv, tonumber(k) + 1)
local bucket, field, id = KEYS[B + 6], ARGV[7], ARGV[8]
if get(bucket, field, id) then return 'had' end
count('enqueued', 1)
if mode == 'queue' then
  redis.call('HSET', bucket, field, 'q')
  redis.call('HSET', ids, id, ARGV[9])
  count('state:queued', 1)
  count('prompt_tokens', tonumber(ARGV[10]))
  return 'queued'
end
redis.call('HSET', bucket, field, 'd')
redis.call('HSET', dead, id, ARGV[10])
count('state:dead', 1)
count('reason:' .. ARGV[9], 1)
return 'buried'
"""


@dataclass(frozen=True)
class InProgress:
    """A conversation still moving: the turn it is at, its skeleton, its turn count."""
    conversation: str
    at: int
    shape: list[dict]
    turns: int


class ConversationLedger:
    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run, self.keys = client, run, RunKeys(run)
        self.ledger = Ledger(client, run)

    def _own(self) -> list[str]:
        k = self.keys
        return [k.conversation_turns, k.conversation_shapes, k.conversation_at, k.conversation_answers]

    # -- reads ------------------------------------------------------------------------------

    def in_progress(self, conversation: str) -> InProgress | None:
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(k.conversation_at, conversation)
            pipe.hget(k.conversation_shapes, conversation)
            pipe.hget(k.conversation_turns, conversation)
            at, shape, turns = pipe.execute()
        if at is None or shape is None or turns is None:
            return None
        return InProgress(conversation, int(at), json.loads(shape), int(turns))

    def answers(self, conversation: str, before: int) -> list[dict]:
        """The kept answers of turns 0 .. before-1."""
        if before == 0:
            return []
        raw = self.client.hmget(self.keys.conversation_answers, [turn_id(conversation, i) for i in range(before)])
        if any(r is None for r in raw):
            raise LookupError(f"conversation {conversation!r}: an answer before turn {before} is missing")
        return [json.loads(r) for r in raw]

    def turns(self, conversations: list[str]) -> list[int | None]:
        """Each conversation's number of turns (None: not in the run)."""
        if not conversations:
            return []
        return [None if r is None else int(r) for r in self.client.hmget(self.keys.conversation_turns, conversations)]

    def complete(self, conversations: list[str]) -> list[bool]:
        """Whether each conversation has every turn stored: registered, and no longer in progress
        (a conversation leaves `at` only when `advance` completes it)."""
        if not conversations:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hmget(self.keys.conversation_turns, conversations)
            pipe.hmget(self.keys.conversation_at, conversations)
            turns, at = pipe.execute()
        return [n is not None and a is None for n, a in zip(turns, at)]

    def positions(self, page: int = 1000):
        """(conversation, turn it is at) of every conversation in progress, a page of HSCAN at a time."""
        for conversation, at in self.client.hscan_iter(self.keys.conversation_at, count=page):
            yield conversation.decode(), int(at)

    # -- transitions ------------------------------------------------------------------------

    def register(self, conversations: list[tuple[str, int, list[dict]]],
                 pipe: redis.client.Pipeline | None = None):
        """(id, turns, skeleton) of new conversations, each at turn 0; one the run has is left alone."""
        if not conversations:
            return []
        args = [x for cid, n, shape in conversations for x in (cid, n, json.dumps(shape, ensure_ascii=False))]
        return self.ledger._script(_REGISTER, self._own(), args, pipe)

    def advance(self, conversation: str, turn: int, answer: dict, turns: int,
                next_ids: list[int] | None = None, letter: tuple[str, str] | None = None) -> str:
        """Turn `turn` is done with `answer`: queue the next turn with `next_ids` (or bury it with
        (reason, letter JSON) when its prompt cannot be made), or complete the conversation.
        Returns QUEUED_NEXT, BURIED_NEXT, COMPLETE, or what stopped it ('stale': not at that
        turn; 'had': the next turn existed; a state of turn `turn` other than done)."""
        this = turn_id(conversation, turn)
        args = [conversation, str(turn), None, this, json.dumps(answer, ensure_ascii=False)]
        buckets = [this]
        if turn + 1 >= turns:
            args.append("last")
        else:
            following = turn_id(conversation, turn + 1)
            buckets.append(following)
            if letter is None:
                args += ["queue", None, following, pack_ids(next_ids), None]
            else:
                args += ["bury", None, following, letter[0], letter[1]]
        names, fields = self.ledger._locate(buckets)
        args[2] = fields[0]
        if len(fields) > 1:
            args[6] = fields[1]
            if letter is None:
                args[9] = count_ids(args[8])
        return self.ledger._script(_ADVANCE, self._own() + names, args).decode()
