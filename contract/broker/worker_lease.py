"""One lease per worker process, not one per delivery: a live worker's lease round is O(1).

kombu's Redis transport leases each delivery on its own: `unacked_index`
scores a delivery with the time it was fetched, and kombu's sweep
(`QoS.restore_visible`) restores every delivery scored from 0 up to `now -
visibility_timeout`. Kept alive that way, a worker re-scored each of its ~256
deliveries every round: Redis work in proportion to what it holds.

The fleet gives each worker process one lease instead. The process draws a
number when it starts (its *holder*, `HOLDER`), and each delivery it takes is
scored with that number negated (`Holder.score`, written by `kombu_take.TAKE`):
below 0, so outside every sweep, and naming its holder. The holder's lease is
its entry in `fleet:leases` (`keys.LEASES`), scored with the time of its last
round on Redis's clock. Then:

- a round renews the lease with one ZADD, whatever the worker holds (`ROUND`);
- a holder whose lease is a whole lease old is dead, frozen or cut off: the
  round of any live worker re-scores its deliveries to 0, a page at a time
  (kombu's own "lapsed": its sweep restores each once, a WATCH transaction),
  and drops the entry when none is left under it. So a dead worker's prompts
  come back between 0.75 and 1.25 leases after its last round (a live
  worker's next round, then the sweep), where a lease per delivery gave
  0.75 to 1;
- the entry is written by the script that records a delivery under it (the
  take), and removed only by a round that finds nothing left under it: no
  delivery is ever scored by a holder that no round can find;
- a delivery given back (a reject with requeue, a shutdown, a task held too
  long) is re-scored to 0 alone (`kombu_redis.expire`), and acknowledging one
  removes it from the index, and so from its holder, as kombu's own ack does:
  nothing else needs to know which holder has what.

A holder that finds its entry gone when it renews (it froze past its lease,
or a failover lost the entry) takes back those of its deliveries that the
sweep has not restored yet (`reclaim`): it still runs them.

kombu's sweep reads `ZRANGE unacked_index <cut-off> 0 BYSCORE REV` (5.7.0),
so a score below 0 is never restored by it (kombu is pinned: `constraints.txt`).
"""
from __future__ import annotations

import os
import secrets
from typing import Iterable, NamedTuple

from contract.keys import LEASES
from contract.broker.kombu_redis import UNACKED_INDEX
from contract.redis_link.scripts import Lua

REAP_PAGE = 1000        # deliveries one round re-scores to 0 at most (the sweep restores 500 a sweep)
LAPSED_PER_ROUND = 8    # lapsed holders one round looks at


class Holder(NamedTuple):
    """A worker process's lease: its number, and the score its deliveries carry."""
    number: int

    @classmethod
    def draw(cls) -> "Holder":
        """A random number from 1 to 2^52: exact as a Redis score (a double), and two processes
        of a 10,000-worker fleet share one with a chance of about 1 in 10^8."""
        return cls(secrets.randbelow(1 << 52) + 1)

    @property
    def name(self) -> str:
        return str(self.number)

    @property
    def score(self) -> float:
        return -float(self.number)


HOLDER = Holder.draw()


def _redraw() -> None:
    global HOLDER
    HOLDER = Holder.draw()


os.register_at_fork(after_in_child=_redraw)  # a forked child is another holder


# KEYS: the leases, kombu's unacked index. ARGV: this holder, Redis's time now, the cut-off (a
# lease ago), the most deliveries to re-score. Returns {1 if this holder's entry was missing, how
# many deliveries of lapsed holders were re-scored to 0}.
ROUND = Lua("""
local missing = redis.call('ZADD', KEYS[1], a.now, a.holder)
local left, reaped = tonumber(a.page), 0
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', a.cutoff, 'LIMIT', 0, tonumber(a.holders))
for _, holder in ipairs(lapsed) do
  if left <= 0 then break end
  local score = -tonumber(holder)
  local tags = redis.call('ZRANGEBYSCORE', KEYS[2], score, score, 'LIMIT', 0, left)
  if #tags > 0 then
    local scored = {}
    for _, tag in ipairs(tags) do
      scored[#scored + 1] = 0
      scored[#scored + 1] = tag
    end
    redis.call('ZADD', KEYS[2], 'XX', unpack(scored))
  end
  if #tags < left then redis.call('ZREM', KEYS[1], holder) end
  left, reaped = left - #tags, reaped + #tags
end
return {missing, reaped}
""", head=("holder", "now", "cutoff", "page", "holders"))

# KEYS: the leases, kombu's unacked index. ARGV: this holder, Redis's time now, its score, then
# tags it holds. Each tag scored 0 (lapsed, not yet restored by the sweep) is scored as this
# holder's again. Returns how many were.
RECLAIM = Lua("""
redis.call('ZADD', KEYS[1], a.now, a.holder)
local taken = 0
for _, held in ipairs(deliveries) do
  if tonumber(redis.call('ZSCORE', KEYS[2], held.tag)) == 0 then
    redis.call('ZADD', KEYS[2], 'XX', a.score, held.tag)
    taken = taken + 1
  end
end
return taken
""", head=("holder", "now", "score"), each=("tag",), records="deliveries")


class Round(NamedTuple):
    """What one lease round found: whether this holder's entry was gone, and how many
    deliveries of lapsed holders it handed to kombu's sweep."""
    missing: bool
    reaped: int


def renew(client, holder: Holder, now: float, lease_seconds: float, page: int = REAP_PAGE) -> Round:
    """Renew `holder`'s lease at `now` and hand the deliveries of up to a page of lapsed holders
    to kombu's sweep: one script, one round trip."""
    missing, reaped = ROUND(client, [LEASES, UNACKED_INDEX], {
        "holder": holder.name, "now": repr(now), "cutoff": repr(now - lease_seconds), "page": page,
        "holders": LAPSED_PER_ROUND})
    return Round(bool(missing), int(reaped))


def reclaim(client, holder: Holder, now: float, tags: Iterable[str]) -> int:
    """Score again as `holder`'s those of `tags` that lapsed and are not restored yet."""
    tags = list(tags)
    if not tags:
        return 0
    return int(RECLAIM(client, [LEASES, UNACKED_INDEX], {"holder": holder.name, "now": repr(now),
                                                          "score": repr(holder.score)},
                       [(tag,) for tag in tags]))


def lapsing(client, now: float, seconds: float) -> bool:
    """Whether some delivery will be restored by kombu's sweep without any live worker's say:
    one scored from 0 up to `seconds` ago (lapsed, or a lease of kombu's own not renewed), or
    one whose holder has not renewed its lease for `seconds` (the round of a live worker hands
    those to the sweep)."""
    return (client.zcount(UNACKED_INDEX, 0, now - seconds) > 0
            or client.zcount(LEASES, "-inf", now - seconds) > 0)
