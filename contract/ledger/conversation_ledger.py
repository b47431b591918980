"""Where each conversation of a run stands: the one owner of a run's conversation keys.

A conversation (`enqueue --turns all`) moves one turn at a time. Its turns are
prompts of the run's `Ledger` (id `<conversation>#<turn>`, `conversations.py`),
and the conversation itself is five small entries (`RunKeys.conversation_*`):
its number of turns (kept for the run's life), and while it is in progress its
skeleton, the turn it is at, the answers of its stored turns, and the server
that generated its last stored turn (where the next turn's prefix is cached:
`workers/servers/affinity.py` sends the next turn there). Two scripts
change them, each one atomic, conditional step:

    register   (none)  -> at 0       the producer, just before it enqueues turn 0
    advance    at k    -> at k + 1   turn k is done: its answer and server are kept and
                                     turn k+1 becomes a queued prompt with its ids (or a
                                     dead one with its letter, when its history cannot be
                                     rendered)
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

from contract.ledger.codec import pack_ids
from contract.chat.conversations import SEPARATOR, turn_id
from contract.keys import RunKeys
from contract.ledger.ledger import READ_CHUNK, Ledger
from contract.ledger.ledger_scripts import PRELUDE
from contract.redis_link.scripts import Lua, lua_string

QUEUED_NEXT, BURIED_NEXT, COMPLETE = "queued", "buried", "complete"

# KEYS[B+1..B+5] (after the ledger's own): turns, shapes, at, answers, servers. Per conversation 1
# (registered) or 0 (the run has it).
_REGISTER = Lua("""
local turns, shapes, at = KEYS[B + 1], KEYS[B + 2], KEYS[B + 3]
local out = {}
for i, c in ipairs(conversations) do
  out[i] = 0
  if redis.call('HSETNX', turns, c.conversation, c.turns) == 1 then
    redis.call('HSET', shapes, c.conversation, c.shape)
    redis.call('HSET', at, c.conversation, 0)
    add('conversations', 1)
    add('conversation_turns', tonumber(c.turns))
    out[i] = 1
  end
end
flush()
return out
""", prelude=PRELUDE, each=("conversation", "turns", "shape"), records="conversations")

# KEYS[B+1..B+5]: turns, shapes, at, answers, servers; KEYS[B+6]: turn k's bucket; KEYS[B+7]:
# turn k+1's. `a.mode`: 'last' (turn k is the last), 'queue' (turn k+1 with `next_ids`) or 'bury'
# (turn k+1 with its `reason` and `letter`); `a.server`: turn k's server ('' if unknown).
_ADVANCE = Lua(f"""
local shapes, at, answers, servers = KEYS[B + 2], KEYS[B + 3], KEYS[B + 4], KEYS[B + 5]
if redis.call('HGET', at, a.conversation) ~= a.turn then return 'stale' end
local found = kind(state({{key = KEYS[B + 6], field = a.field}}))
if found ~= 'done' then return found or '' end
if a.mode == 'last' then
  local fields = {{}}
  for i = 0, tonumber(a.turn) - 1 do fields[#fields + 1] = a.conversation .. {lua_string(SEPARATOR)} .. i end
  if #fields > 0 then redis.call('HDEL', answers, unpack(fields)) end
  redis.call('HDEL', shapes, a.conversation)
  redis.call('HDEL', at, a.conversation)
  redis.call('HDEL', servers, a.conversation)
  add('conversations_complete', 1)
  flush()
  return 'complete'
end
redis.call('HSET', answers, a.id, a.answer)
redis.call('HSET', at, a.conversation, tonumber(a.turn) + 1)
if a.server ~= '' then redis.call('HSET', servers, a.conversation, a.server)
else redis.call('HDEL', servers, a.conversation) end
local following = {{key = KEYS[B + 7], field = a.next_field, id = a.next_id, ids = a.next_ids, tokens = a.next_tokens}}
if state(following) then return 'had' end
if a.mode == 'queue' then
  queue(following, 'q', nil)
  flush()
  return 'queued'
end
bury(following, nil, a.reason, a.letter)
flush()
return 'buried'
""", prelude=PRELUDE, head=("conversation", "turn", "field", "id", "answer", "mode",
                             "next_field", "next_id", "next_ids", "next_tokens", "reason", "letter",
                             "server"))


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
        return [k.conversation_turns, k.conversation_shapes, k.conversation_at, k.conversation_answers,
                k.conversation_server]

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

    def server(self, conversation: str) -> str | None:
        """The server that generated the conversation's last stored turn (None: not known, or none yet)."""
        found = self.client.hget(self.keys.conversation_server, conversation)
        return found.decode() if found is not None else None

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

    def register(self, conversations: list[tuple[str, int, list[dict]]]) -> list[int]:
        """(id, turns, skeleton) of new conversations, each at turn 0, one script call per
        `READ_CHUNK` of them; returns per conversation 1 (registered) or 0 (the run had it:
        left alone)."""
        each = [(cid, n, json.dumps(shape, ensure_ascii=False)) for cid, n, shape in conversations]
        return [registered for start in range(0, len(each), READ_CHUNK)
                for registered in self.ledger.call(_REGISTER, self._own(), each=each[start:start + READ_CHUNK])]

    def advance(self, conversation: str, turn: int, answer: dict, turns: int,
                next_ids: list[int] | None = None, letter: tuple[str, str] | None = None,
                server: str | None = None) -> str:
        """Turn `turn` is done with `answer` (generated by `server`): queue the next turn with
        `next_ids` (or bury it with (reason, letter JSON) when its prompt cannot be made), or
        complete the conversation.
        Returns QUEUED_NEXT, BURIED_NEXT, COMPLETE, or what stopped it ('stale': not at that
        turn; 'had': the next turn existed; a state of turn `turn` other than done)."""
        this = turn_id(conversation, turn)
        head = {"conversation": conversation, "turn": turn, "id": this,
                "answer": json.dumps(answer, ensure_ascii=False), "server": server or ""}
        if turn + 1 >= turns:
            head["mode"] = "last"
        elif letter is None:
            head.update(mode="queue", next_id=turn_id(conversation, turn + 1), next_ids=pack_ids(next_ids),
                        next_tokens=len(next_ids))
        else:
            head.update(mode="bury", next_id=turn_id(conversation, turn + 1), reason=letter[0], letter=letter[1])
        buckets, fields = self.ledger.locations([this] + ([head["next_id"]] if "next_id" in head else []))
        head.update(zip(("field", "next_field"), fields))
        return self.ledger.call(_ADVANCE, self._own() + buckets, head).decode()
