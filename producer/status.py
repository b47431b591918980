"""Where a run stands, read from Redis: what the `status` command prints.

Counts come from the counts the ledger's transitions keep (O(1), however
large the run), rates from the per-minute counters the workers keep, server
health, the output storage's state and each server's prefix-cache hit share over
the last minutes from the workers' own heartbeats (each worker's
view of the servers it is bound to and of `OUTPUT_DIR`, found through the
workers' registry, never a scan of the keyspace), and the queue depth from
the broker; a run with a verifier adds its samples by verdict (passed,
failed, error), counted by the ledger as each is stored. So `status` sends the same few commands whatever the run's size
(`tests/test_scale.py`, `python -m bench --parts scale`).

In a run of several samples a prompt (`enqueue --samples N`) each sample is a
ledger entry: queued, in flight, done and dead count samples, `samples` all of
them, and `prompts` the distinct prompts (the run's `prompts` counter, which
`enqueue` keeps in the same step as each prompt's sample 0).
"""
from __future__ import annotations


import redis

from contract.fleet import heartbeats
from contract.fleet.cache_hits import WINDOW_S, merge_servers
from contract.redis_link.clock import CLOCK
from contract.keys import queue_for
from contract.broker.kombu_redis import queue_depth
from contract.ledger.ledger import Ledger, Tally
from contract.fleet.provenance import read_provenance, summary as provenance_summary
from contract.run.spec import RunSpec

RATE_MINUTES = 5


def collect_status(client: redis.Redis, spec: RunSpec, queue_prefix: str) -> dict:
    ledger = Ledger(client, spec.name)
    counters = ledger.counters()
    tally = Tally.from_counters(counters)
    queue = queue_for(queue_prefix, spec.served_model)
    done, dead, pending = tally.done, tally.dead, tally.queued  # pending: queued, in flight or lost in transit
    samples, tokens, window = ledger.recent(RATE_MINUTES)
    window = max(1.0, min(window, CLOCK.now(client) - spec.created_at))  # a young run: since it began
    rate = samples / window
    records = heartbeats.read_all(client)
    in_flight = in_flight_of(records, spec.name, pending)
    entries = done + dead + pending
    return {
        "run": spec.name,
        "queue": queue,
        # a run of several samples a prompt: its distinct prompts (counted at enqueue); below, its
        # samples (ledger entries), which queued, in_flight, done and dead count
        "prompts": entries if spec.samples == 1 or tally.prompts is None else tally.prompts,
        "samples": entries,
        "samples_per_prompt": spec.samples,
        "until_verified": spec.until_verified,
        "queued": pending - in_flight,
        "in_flight": in_flight,
        # messages on the queue, of every run that shares it: never a count of this run's
        "queue_depth": queue_depth(client, queue),
        "pending": pending,
        "done": done,
        "dead": dead,
        "dead_by_reason": dict(tally.reasons),
        "prompt_tokens": tally.prompt_tokens,
        "output_tokens": tally.output_tokens,
        "samples_per_s": round(rate, 3),
        "tokens_per_s": round(tokens / window, 1),
        "rate_window_s": round(window),
        "eta_s": round(pending / rate) if rate and pending else (0 if not pending else None),
        "workers": (workers := _workers(client, records)),
        "cache_hits": _cache_hits(workers),
        "finished": pending == 0,
        # what made the samples so far: servers, SGLang and weight versions (contract/fleet/provenance.py)
        "provenance": provenance_summary(read_provenance(client, spec.name)),
        "verdicts": {k.split(":", 1)[1]: v for k, v in sorted(counters.items()) if k.startswith("verdict:")},
        **_conversations(spec, counters, done, dead, pending),
        **_verification(spec, tally),
    }


def verification(spec: RunSpec, tally: Tally) -> dict:
    """A run with a verifier (`enqueue --verify`): its stored samples by verdict class, the pass
    rate among them, and the samples spent (stored or dead-lettered) per passing one."""
    passed, failed, errors = (tally.verdicts.get(k, 0) for k in ("pass", "fail", "error"))
    checked = passed + failed + errors
    return {"verifier": spec.verify, "passed": passed, "failed": failed, "error": errors, "checked": checked,
            "pass_rate": round(passed / checked, 4) if checked else None,
            "samples_per_verified": round((tally.done + tally.dead) / passed, 2) if passed else None}


def _verification(spec: RunSpec, tally: Tally) -> dict:
    return {"verification": verification(spec, tally)} if spec.verify else {}


def _conversations(spec: RunSpec, counters: dict[str, int], done: int, dead: int, pending: int) -> dict:
    """A run of conversations (`--turns all`) holds only turns: its prompts are its turns, and a
    conversation is stopped exactly while its current turn is dead."""
    if spec.turns != "all":
        return {}
    total, complete = counters.get("conversations", 0), counters.get("conversations_complete", 0)
    moving = max(total - complete - dead, 0)  # a turn queued, in flight, or just stored
    return {"finished": pending == 0 and moving == 0, "conversations": {"enqueued": total, "complete": complete, "stopped": dead,
                              "in_progress": moving,
                              "turns": counters.get("conversation_turns", 0), "turns_done": done}}


def in_flight_of(records: list[dict], run: str, pending: int) -> int:
    """The run's prompts that live workers hold (`holding` in their heartbeats), at most its
    pending ones (a heartbeat may list a prompt stored since). Never derived from the queue's
    depth, which counts every run's messages on a shared queue."""
    held = set().union(*((r.get("holding") or {}).get(run, ()) for r in records))
    return min(len(held), pending)


def _workers(client: redis.Redis, records: list[dict]) -> list[dict]:
    now = CLOCK.now(client)  # heartbeats are timed on Redis's clock
    return [{"worker": w["worker"], "host": w["host"], "pid": w["pid"],
             "seen_s_ago": round(now - w["at"], 1), "servers": w["servers"],
             "storage": _storage(w, now), "cache_hits": w.get("cache_hits"), "cpu": w.get("cpu") or {}}
            for w in records]


def _cache_hits(workers: list[dict]) -> dict:
    """Each bound server's prefix-cache hit share over the workers' last minutes, all workers
    (and all runs) together; `share` None where no answer in the window said."""
    windows = [w["cache_hits"].get("window_s") for w in workers if w.get("cache_hits")]
    servers = {s["url"] for w in workers for s in w["servers"]}
    return {"window_s": max(windows, default=WINDOW_S),
            "servers": merge_servers((w.get("cache_hits") for w in workers), servers)}


def _storage(heartbeat: dict, now: float) -> dict:
    """The worker's storage state, its last change placed on Redis's clock (`since`, and
    `age_s` before `now`) from how long ago the worker saw it, never from the worker's clock."""
    storage = dict(heartbeat.get("storage") or {})
    if "for_s" in storage:
        storage["since"] = round(heartbeat["at"] - storage.pop("for_s"), 1)
        storage["age_s"] = round(now - storage["since"], 1)
    return storage
