"""kombu's take and acknowledgement in a few Redis commands per round trip, not nine per message.

kombu's Redis transport takes one message per BRPOP, records it as
unacknowledged in a MULTI/ZADD/HSET/EXEC transaction (`QoS.append`: the whole
message sent back to Redis), and acknowledges it with another (ZREM + HDEL):
ten commands and three round trips per message, the larger half of a sample's
Redis cost. The fleet keeps kombu's keys, values and rules (a delivery is
the `unacked` hash's entry `[message, exchange, routing key]` under its tag,
and its lease the tag's score in `unacked_index`; `kombu_redis` says where
they were read) and changes only how many commands carry them:

- **take**: once BRPOP has taken a message, one script (`TAKE`) records it
  and takes up to `most` more from the same lists, in the order BRPOP was
  given them (priority, then queue), recording each in the same atomic step:
  a message taken by the script is never off its queue without being
  unacknowledged, and its body never crosses the network back to Redis.
  Each is scored with the taking worker's lease holder, not the time
  (`worker_lease` says why), and the holder's lease is renewed in the same
  step, so a delivery never names a holder without a lease.
  `most` is what the channel's prefetch count still allows
  (`QoS.can_consume_max_estimate`), at most `MOST_PER_TAKE`, so one script
  stays short on Redis's one thread. A message the script cannot read as a
  kombu message (no delivery tag or delivery info) is returned unrecorded,
  for kombu's own path to record or refuse, as it would have.
- **acknowledge**: a group commit acknowledges its samples' deliveries in the
  same round trip that marks them done (`forget` on its pipeline, after the
  done marks: acknowledged only once durable and done), and kombu's own ack of
  such a tag later only settles the channel's memory (`kombu_redis.settled`).

`kombu_redis.batch_takes` installs both into kombu.
"""
from __future__ import annotations

from typing import NamedTuple

from kombu.utils.json import dumps, loads

from .keys import LEASES
from .kombu_redis import UNACKED, UNACKED_INDEX
from .scripts import Lua
from .worker_lease import Holder

MOST_PER_TAKE = 100  # messages one TAKE may take besides BRPOP's (~1 ms of Redis at most)

# KEYS: the unacked hash, its index, the leases, then the lists in BRPOP's order. ARGV: the time
# (kombu's `time()`), the holder and its score, the most to take, and the message BRPOP took (its
# tag and unacked entry; '' when none). Returns, per message taken here, its list, the message,
# and 1 if recorded.
TAKE = Lua("""
local scores, entries, out = {}, {}, {}
local function record(tag, entry)
  scores[#scores + 1] = a.score
  scores[#scores + 1] = tag
  entries[#entries + 1] = tag
  entries[#entries + 1] = entry
end
if a.tag ~= '' then record(a.tag, a.entry) end
local left = tonumber(a.most)
for i = 4, #KEYS do
  if left <= 0 then break end
  local taken = redis.call('RPOP', KEYS[i], left)
  if taken then
    for _, raw in ipairs(taken) do
      local ok, m = pcall(cjson.decode, raw)
      local p = ok and type(m) == 'table' and m.properties
      local info = type(p) == 'table' and p.delivery_info
      local readable = type(info) == 'table' and type(p.delivery_tag) == 'string'
        and type(info.exchange) == 'string' and type(info.routing_key) == 'string'
      if readable then
        record(p.delivery_tag, '[' .. raw .. ',' .. cjson.encode(info.exchange) .. ',' .. cjson.encode(info.routing_key) .. ']')
      end
      out[#out + 1] = {KEYS[i], raw, readable and 1 or 0}
    end
    left = left - #taken
  end
end
if #scores > 0 then
  redis.call('ZADD', KEYS[3], a.now, a.holder)
  redis.call('ZADD', KEYS[2], unpack(scores))
  redis.call('HSET', KEYS[1], unpack(entries))
end
return out
""", head=("now", "holder", "score", "most", "tag", "entry"))


class Taken(NamedTuple):
    """A message the script took: the list it came from, the message, whether it is recorded."""
    source: str
    payload: dict
    recorded: bool


def unacked_entry(payload: dict) -> str:
    """The `unacked` hash's value for a message, as kombu's `QoS.append` writes it (kombu's JSON,
    which also carries the types its own `loads` made of the message)."""
    info = payload["properties"]["delivery_info"]
    return dumps([payload, info["exchange"], info["routing_key"]])


def take(client, lists: list[str], first: dict | None, most: int, now: float, holder: Holder) -> list[Taken]:
    """Record `first` (the message BRPOP took, if any) as unacknowledged under `holder`'s lease,
    and take up to `most` more from `lists` (BRPOP's order), each recorded in the same script."""
    head = {"now": repr(now), "holder": holder.name, "score": repr(holder.score),
            "most": max(0, min(most, MOST_PER_TAKE)), "tag": "", "entry": ""}
    if first is not None:
        head.update(tag=first["properties"]["delivery_tag"], entry=unacked_entry(first))
    reply = TAKE(client, [UNACKED, UNACKED_INDEX, LEASES, *lists], head)
    return [Taken(source.decode(), loads(raw.decode()), bool(recorded)) for source, raw, recorded in reply]


def forget(pipe, tags: list[str]) -> None:
    """Acknowledge deliveries by tag on a caller's pipeline (kombu's `_remove_from_indices`)."""
    if tags:
        pipe.zrem(UNACKED_INDEX, *tags)
        pipe.hdel(UNACKED, *tags)


def readable(payload) -> bool:
    """Whether a message is one `take` can record (kombu's append needs its tag and delivery info)."""
    try:
        info = payload["properties"]["delivery_info"]
        return all(isinstance(v, str) for v in (payload["properties"]["delivery_tag"], info["exchange"],
                                                info["routing_key"]))
    except (KeyError, TypeError):
        return False
