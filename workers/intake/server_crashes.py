"""Prompts in flight when their server died, and how the one that kills it is found.

A prompt that kills its server (SGLang 0.5.23 dies whole on an input id its
model lacks) would be sent again after every restart, and take the server
down each time. Every request in flight there dies with it, so one crash
cannot say which prompt did it.

Invariant: a prompt becomes a `server_crash` dead letter only when its server
died twice (`SOLO_DEATHS`) while it was sent *alone* among the suspects; no
other prompt is blamed. Why it holds: a prompt in flight at a crash is noted
(server, time, and whether it was alone, in Redis, so any worker that takes it
later knows), and a noted prompt is never again sent beside the other
suspects: it waits for its server's solo slot (one per server URL,
fleet-wide, in Redis) and goes alone among suspects as a one-token probe: a
prompt that kills at prefill does it there, and a probe that comes back
clears it to go on as usual. The worker sends nothing else to that server
while its suspects of the crash wait for their probes
(`ServerBinding.suspects`), so on a restarted server, empty, the probes run
first, each alone and quick. The bystanders of a crash are noted, pass their
probe, and finish; the killer dies on its probe, twice. Twice, because a
server killed from outside (an operator, the OOM killer) in the instant a
probe is in flight looks the same as the probe killing it: one such death
costs the probe's prompt one more probe, not its sample. A prompt noted at
`WHOLE_ALONE` crashes (one that kills later in its generation) goes alone for
its whole generation. A bystander is in flight at two crashes at most for one
killer (its first, and one of the killer's probes), so it never gets that far.

The notes of a run are looked for only when the run has any (a count read at
most every `NOTES_TTL` seconds a run), so a run without crashes pays no round
trip per prompt.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import redis

from contract.keys import SOLO_PREFIX, RunKeys

log = logging.getLogger(__name__)

NOTES_TTL = 2.0       # seconds a run's count of noted prompts is trusted
SOLO_DEATHS = 2       # deaths of its server while it was sent alone that make a prompt their cause
WHOLE_ALONE = 3       # crash notes after which a prompt's whole generation goes alone
CUT_CONFIRM_SECONDS = 120.0  # a suspect's request cut by the health monitor: how long its server may take to die
SOLO_LEASE_MS = 30_000  # the solo slot's lease, renewed while its request runs
SOLO_POLL = 0.25
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0")
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
          "return 0")

_counts: dict[str, tuple[int, float]] = {}  # run -> (noted prompts, when read)
_counts_lock = threading.Lock()


class SoloBusy(Exception):
    """The server's solo slot did not come free in time."""


def suspect_key(run: str, prompt_id: str) -> str:
    """How a worker's server bindings list a crash suspect (`ServerBinding.suspects`)."""
    return f"{run}/{prompt_id}"


def convicted(crashes: list[dict]) -> bool:
    """Whether these crashes make the prompt their cause: its server died `SOLO_DEATHS` times while it
    was sent there alone."""
    return sum(1 for crash in crashes if crash.get("alone")) >= SOLO_DEATHS


def notes(client: redis.Redis, run: str, prompt_id: str) -> list[dict]:
    """The crashes this prompt was in flight at: [{"server", "at", "alone"}], oldest first."""
    with _counts_lock:
        count, read = _counts.get(run, (0, 0.0))
    if time.monotonic() - read > NOTES_TTL:
        count = client.hlen(RunKeys(run).server_crashes)
        with _counts_lock:
            _counts[run] = (count, time.monotonic())
    if not count:
        return []
    raw = client.hget(RunKeys(run).server_crashes, prompt_id)
    return json.loads(raw) if raw else []


def note(client: redis.Redis, run: str, prompt_id: str, known: list[dict], server: str, at: float,
         alone: bool) -> list[dict]:
    """Add a crash to the prompt's notes (its task holds the prompt: no other writer); the notes now."""
    noted = [*known, {"server": server, "at": at, "alone": alone}]
    client.hset(RunKeys(run).server_crashes, prompt_id, json.dumps(noted))
    with _counts_lock:
        _counts.pop(run, None)
    return noted


@contextmanager
def solo(client: redis.Redis, server: str, holder: str, wait: float) -> Iterator[None]:
    """Hold `server`'s solo slot (fleet-wide) while the block runs; `SoloBusy` after `wait` seconds."""
    key, token = f"{SOLO_PREFIX}{server}", f"{holder}:{uuid.uuid4().hex}"
    deadline = time.monotonic() + wait
    while not client.set(key, token, nx=True, px=SOLO_LEASE_MS):
        if time.monotonic() > deadline:
            raise SoloBusy(f"{server}: another crash suspect is being sent there alone")
        time.sleep(SOLO_POLL)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(client, key, token, stop), name="fleet-solo", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        try:
            client.eval(_RELEASE, 1, key, token)
        except redis.RedisError as exc:  # its lease ends it within SOLO_LEASE_MS
            log.warning("could not free the solo slot of %s (%r)", server, exc)


def _renew(client: redis.Redis, key: str, token: str, stop: threading.Event) -> None:
    while not stop.wait(SOLO_LEASE_MS / 3000):
        try:
            client.eval(_RENEW, 1, key, token, SOLO_LEASE_MS)
        except redis.RedisError:
            pass
