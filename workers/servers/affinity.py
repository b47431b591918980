"""Affinity: send a prompt where its prefix is already in a server's prefix cache, within a load guard.

SGLang keeps computed prefixes in its radix cache and skips their prefill
(`meta_info.cached_tokens`). A prompt shares its leading tokens with another
in two common cases, and this module names the server that holds them:

- **a conversation's next turn** (`enqueue --turns all`): turn k+1's prompt
  starts with turn k's, so it goes to the server that generated turn k. That
  server is recorded in the conversation ledger (`ConversationLedger.server`,
  one field per conversation in progress, dropped when it completes), so
  every worker reads it, across redeliveries and worker restarts. It is the
  binding's URL as the worker holds it (redacted: never a credential).
- **the samples of one prompt** (`enqueue --samples N`): identical ids, so
  the last key below (the whole prompt's) sends samples 1 to N-1 where
  sample 0 went, while the load guard allows, and N - 1 of N hit its cache.
- **a shared prefix** (a long system prompt, a few-shot preamble): prompts
  whose first block of `BLOCK` tokens or more match what a server was recently
  sent go to that server. `RecentPrefixes` maps a hash of each leading run of
  whole blocks (up to `MAX_BLOCKS`) to the server last sent it, an LRU of at
  most `ENTRIES` entries: bounded memory whatever the run's size. A prompt
  is recorded when it is sent (as SGLang's gateway inserts at routing time),
  so a burst of prompts under one new system prompt follows the first one.
  A prompt the load guard sent elsewhere (a spill) moves its prefix only
  after `MOVE_AFTER` spills in a row: moving it on every spill made each
  prefix wander over every server and miss (in the bench, 45 moves per
  system prompt in 160 prompts), never moving it left a server that got
  three of the eight system prompts spilling a third of its prompts for
  good. A server that is down or refused moves it at once.
  The map is the worker's own, not shared in Redis: it costs no round trip
  per prompt, and a second worker bound to the same servers learns its own
  placement after one prompt per prefix (the price: a prefix may be cached
  on one server per worker instead of one in all).

**The load guard** (`sticky`): the preferred server is used only while its
load exceeds the least loaded candidate's by at most `margin`
(`FLEET_AFFINITY_MARGIN`, default 0.25), loads as shares of capacity
(`load`: the worker's own requests in flight there, plus the other
clients' that the server's last report of its running and waiting requests
shows, so other workers' requests count too). Beyond it load wins, as in SGLang's gateway, which
drops affinity once the busiest worker has both 64 more requests and 1.5
times the least busy one's. The gateway queues without limit at its workers;
the fleet keeps each server at its batch plus an eighth (`capacity.headroom`),
so an imbalance there soon means idle batch slots, and the margin is tighter:
a quarter of capacity lets the least loaded server spend its eighth of queue
and then run up to an eighth of its batch short before load wins. At an
eighth (no slot ever idle) a conversation changed server at 12% of its turns
in the bench (`python -m bench --parts cache`) and the hit share was 0.87 of
the best client's; at a quarter 0.93, at the same throughput.

Affinity never overrides health, refusal or capacity: only a usable server
that serves the prompt's model is ever preferred (`ServerPool` passes only
those), a retry's `avoid` wins over it, and a prompt waits for its preferred
server's free slot rather than exceed its target. Pure: no I/O here but the
one ledger read in `Affinity.route`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, Sequence

import redis

from contract.ledger.conversation_ledger import ConversationLedger
from contract.chat.conversations import split_turn_id

log = logging.getLogger(__name__)

BLOCK = 64           # tokens per block: a prefix shorter than one block gives no affinity
MAX_BLOCKS = 128     # affinity by the leading 8,192 tokens at most: enough to tell prefixes apart
ENTRIES = 1 << 16    # blocks remembered per worker (a few MiB); shared prefixes stay, being re-sent
DEFAULT_MARGIN = 0.25
REPORT_FRESH = 10.0  # seconds a server's reported load counts in `load`
MOVE_AFTER = 4       # spills in a row that move a prefix to the server it spilled to


class Loaded(Protocol):
    """What the guard reads of a binding (`workers.servers.bindings.ServerBinding`)."""
    url: str
    in_flight: int
    target: int
    capacity: int | None
    bound: int  # FLEET_MAX_INFLIGHT_PER_SERVER: the most this worker keeps in flight there
    reported: tuple[int, float] | None  # others' requests the server last reported, and when (monotonic)


def others(reported_running: int, reported_waiting: int, in_flight: int) -> int:
    """Requests on the server that are not this worker's, by its report and this worker's count."""
    return max(0, reported_running + reported_waiting - in_flight)


def load(binding: Loaded, now: float | None = None) -> float:
    """Requests on the server as a share of what this worker may fill of it: its capacity (its target
    where capacity is unknown), or `FLEET_MAX_INFLIGHT_PER_SERVER` where that is less (`bound`): this
    worker's in flight there, plus the others' its last report counted (while fresh). Under a cap far
    below the batch, the server's own share would stay small with every slot this worker may use held,
    and a prompt would wait for it while another server had free slots."""
    held = binding.in_flight
    if binding.reported is not None:
        count, at = binding.reported
        if (time.monotonic() if now is None else now) - at <= REPORT_FRESH:
            held += count
    return held / max(1, min(binding.capacity or binding.target, binding.bound))


def sticky(prefer: str | None, candidates: Sequence[Loaded], margin: float,
           avoid: str | None = None) -> Loaded | None:
    """The preferred server, if it is a candidate (usable, of the prompt's model), is not the one a
    retry avoids, and its load is within `margin` of the least loaded candidate's; else None."""
    if prefer is None or prefer == avoid:
        return None
    chosen = next((b for b in candidates if b.url == prefer), None)
    if chosen is None:
        return None
    now = time.monotonic()
    least = min(load(b, now) for b in candidates)
    return chosen if load(chosen, now) - least <= margin else None


def block_keys(ids: Sequence[int]) -> list[int]:
    """A hash of each leading run of whole blocks of `ids` (first block, first two, ...), then,
    where the ids end within `MAX_BLOCKS` blocks, of the whole prompt: so the samples of one
    prompt (`enqueue --samples`, identical ids) follow the first to its server even where the
    prompt is shorter than a block, or ends in a part of one."""
    keys, running, end = [], 0, 0
    for start in range(0, min(len(ids), BLOCK * MAX_BLOCKS) - BLOCK + 1, BLOCK):
        running = hash((running, tuple(ids[start:start + BLOCK])))
        keys.append(running)
        end = start + BLOCK
    if end < len(ids) <= BLOCK * MAX_BLOCKS:
        keys.append(hash((running, tuple(ids[end:]), "whole")))
    return keys


class RecentPrefixes:
    """Leading blocks -> the server they were sent to; least recently sent forgotten past `entries`.

    A block's server moves when a prompt with it is sent elsewhere, except that a spill (the load
    guard sent it elsewhere though its server could take it) moves it only after `MOVE_AFTER`
    spills in a row: a server that stays loaded sheds a prefix, one that spills now and then
    keeps it (`Affinity.sent`)."""

    def __init__(self, entries: int = ENTRIES):
        self.entries = entries
        self._servers: OrderedDict[int, list] = OrderedDict()  # key -> [server, spills in a row]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._servers)

    def server_for(self, keys: Sequence[int]) -> str | None:
        """The server of the longest of these leading runs, if any was sent."""
        with self._lock:
            for key in reversed(keys):
                entry = self._servers.get(key)
                if entry is not None:
                    return entry[0]
        return None

    def sent(self, keys: Sequence[int], server: str, spilled: bool = False) -> None:
        with self._lock:
            for key in keys:
                entry = self._servers.get(key)
                if entry is None or entry[0] == server or not spilled:
                    self._servers[key] = [server, 0]
                else:
                    entry[1] += 1
                    if entry[1] >= MOVE_AFTER:
                        entry[:] = [server, 0]
                self._servers.move_to_end(key)
            while len(self._servers) > self.entries:
                self._servers.popitem(last=False)


@dataclass(frozen=True)
class Route:
    """One prompt's affinity: the server it prefers (None: load decides), and its leading blocks."""
    prefer: str | None
    keys: list[int]
    why: str  # "conversation", "prefix" or "" (none), for the log and the metrics


NO_ROUTE = Route(None, [], "")


class Affinity:
    """A worker's affinity: on (`FLEET_AFFINITY`) or off, and its recent prefixes."""

    def __init__(self, enabled: bool = True, entries: int = ENTRIES):
        self.enabled = enabled
        self.prefixes = RecentPrefixes(entries)

    def route(self, client: redis.Redis, run: str, conversations: bool, prompt_id: str,
              prompt_ids: Sequence[int]) -> Route:
        """Where this prompt's prefix is: its conversation's last server, else the server sent its
        longest leading blocks most recently, else nowhere."""
        if not self.enabled:
            return NO_ROUTE
        keys = block_keys(prompt_ids)
        if conversations and (server := _conversation_server(client, run, prompt_id)):
            return Route(server, keys, "conversation")
        server = self.prefixes.server_for(keys)
        return Route(server, keys, "prefix" if server else "")

    def prefer(self, route: Route) -> str | None:
        """The route's server as of now (`ServerPool.acquire` asks at each pick): its conversation's,
        else the server its longest leading run was last sent to, which a prompt of the same prefix
        (a sample of the same prompt) picked since `route` may have set."""
        if not self.enabled or route.why == "conversation":
            return route.prefer
        return self.prefixes.server_for(route.keys) if route.keys else None

    def sent(self, route: Route, server: str, spilled: bool = False) -> None:
        """The prompt went to `server` (`spilled`: by the load guard, from its preferred server)."""
        if self.enabled and route.keys:
            self.prefixes.sent(route.keys, server, spilled)


def _conversation_server(client: redis.Redis, run: str, prompt_id: str) -> str | None:
    """The server that generated the previous turn (None for a first turn, or when Redis cannot
    say: affinity is a preference, never a reason for a prompt to fail)."""
    try:
        conversation, turn = split_turn_id(prompt_id)
    except ValueError:
        return None
    if turn == 0:
        return None
    try:
        return ConversationLedger(client, run).server(conversation)
    except redis.RedisError as exc:
        log.debug("conversation %s: its last server could not be read (%r)", conversation, exc)
        return None
