"""Behind Redis Sentinel, a failover loses nothing, runs nothing twice, and `status` catches up at once.

A real topology (a primary, a replica with `appendfsync always`, three
Sentinels; `sentinel_topology.py`), two real workers on `sentinel://`, real
producer commands and the SGLang stand-in, which counts the generations of
each prompt and lists the ones it is generating. Each case strikes mid-run,
twice in a row (the second once the topology has healed from the first): a
SIGKILLed primary (started again as a replica), a primary frozen for 12 s
(SIGSTOP, then SIGCONT: it comes back believing it is the primary until the
Sentinels demote it), and an operator's `SENTINEL FAILOVER`. Then, at the
strictest reading: every prompt ends stored with its exact tokens or
dead-lettered with its reason; the export holds each id once; `status`
reports the run finished within `RECOVERY_S` of the shards holding every
stored prompt; and no prompt is generated a second time unless the stand-in
was generating it at the instant a fault began (a prompt that starts or
finishes during the failover is generated once). The leases are left at
their default (120 s), so a done mark lost with the old primary would show
as a late `status` and a second generation, not hide inside a short lease.
The switchover is also struck during `enqueue --turns all` conversations, and
a switchover and a freeze with Flower running on `sentinel://` across them:
it hears the workers again afterwards (`workers/intake/transport.py`'s poller).

`FLEET_FAILOVER_PROMPTS` sets the run's size, `FLEET_FAILOVER_AT` the share
stored at the first fault, `FLEET_FAILOVER_TIMES` how many faults, and
`FLEET_FAILOVER_STEP` the stand-in's decode step (the documented figures: 300
prompts, one fault at 0.77, step 0.02); `FLEET_FAILOVER_FIGURES=PATH` appends
each run's figures to PATH as JSON lines.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from contract.redis_link.connections import redis_for
from contract.ledger.ledger import Ledger, Tally
from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from sglang_standin.config import StandinConfig

from conftest import Fleet, messages_of, render, varied_prompts, write_prompts
from test_conversations import MAX_NEW_TOKENS as TURN_TOKENS, conversations, replay
from waiting import wait_until
from sentinel_topology import MASTER, Topology
from reporting.test_flower import start_flower, succeeded, worker_online

N = int(os.environ.get("FLEET_FAILOVER_PROMPTS", "100"))
FAULT_AT = float(os.environ.get("FLEET_FAILOVER_AT", "0.3"))  # share of the run stored at the first fault
FAULTS = int(os.environ.get("FLEET_FAILOVER_TIMES", "2"))
CONVERSATIONS = int(os.environ.get("FLEET_FAILOVER_CONVERSATIONS", "16"))
FREEZE_S = 12.0
RECOVERY_S = 30.0
MAX_NEW_TOKENS = 512  # some prompts hit it: dead letters (truncated) beside the stored samples
STEP = os.environ.get("FLEET_FAILOVER_STEP", "0.04")  # seconds per decode step: both faults strike mid-run
STANDIN = ("--step-base", STEP, "--max-running-requests", "16")  # most of the run queued, not in flight


class SentinelFleet(Fleet):
    """The fleet of `conftest` with `REDIS_URL` naming the Sentinels, and the test's own reads
    through the same kind of client the fleet uses (it follows the master)."""

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(FLEET_SENTINEL_MASTER=MASTER, **extra)

    def states(self, run: str = "default") -> dict[str, int]:
        return Ledger(redis_for(self.redis_url), run).counts()

    def finished(self, run: str = "default") -> bool:
        """What `status` reports as finished (`producer/status.py`), read as it reads it: no prompt
        queued or in flight by the ledger's counts, and no conversation between turns."""
        counters = Ledger(redis_for(self.redis_url), run).counters()
        tally = Tally.from_counters(counters)
        moving = counters.get("conversations", 0) - counters.get("conversations_complete", 0) - tally.dead
        return bool(counters) and tally.queued == 0 and moving <= 0


@pytest.fixture
def topology(tmp_path: Path, request):
    t = Topology(tmp_path / "logs", replicas=getattr(request, "param", 1)).start()
    yield t
    t.stop()


@pytest.fixture
def sfleet(tmp_path: Path, topology: Topology):
    f = SentinelFleet(tmp_path, topology.url)
    yield f
    f.stop()


# -- the faults: each returns once the topology has healed (a primary and an in-sync replica) --

def kill(t: Topology) -> None:
    old = t.primary_port()
    t.servers[old].kill()
    t.revive(old, t.wait_switched(old))


def freeze(t: Topology) -> None:
    old = t.primary_port()
    frozen = time.monotonic()
    t.servers[old].signal(signal.SIGSTOP)
    new = t.wait_switched(old)
    time.sleep(max(0.0, frozen + FREEZE_S - time.monotonic()))  # the fault itself: frozen this long
    t.servers[old].signal(signal.SIGCONT)
    t.wait_replica(old, new)


def switchover(t: Topology) -> None:
    old = t.primary_port()
    t.wait_replica(old, t.switch_over(old))


FAULTS_BY_NAME = {"kill": kill, "freeze": freeze, "switchover": switchover}


# -- watching a run ---------------------------------------------------------------------------

@dataclass
class Watch:
    """What the test saw of one run: the prompts the stand-in was generating at each fault's
    instant, and when the shards held which ids and `status` said finished."""
    standin: str
    generating_at_faults: set[str] = field(default_factory=set)
    shard_ids: dict[str, float] = field(default_factory=dict)  # id -> first seen in a shard
    finished_at: float | None = None
    _read: set[str] = field(default_factory=set)

    def stats(self) -> dict:
        return httpx.get(f"{self.standin}/standin/stats", timeout=10).json()

    def fault(self, strike, topology: Topology) -> None:
        """The instant the fault begins, the prompts being generated are the only ones that may
        be generated again."""
        self.generating_at_faults |= set(self.stats()["generating"])
        strike(topology)

    def look(self, fleet: SentinelFleet) -> bool:
        """Note new shards' ids and whether status says finished; True once it does."""
        now = time.monotonic()
        folder = fleet.output_dir / "default"
        for f in sorted(folder.glob("*.parquet")) if folder.exists() else []:
            if f.name.startswith((".", "_")) or f.name in self._read:
                continue
            self._read.add(f.name)
            for pid in pq.read_table(f, columns=["id"]).column("id").to_pylist():
                self.shard_ids.setdefault(pid, now)
        finished = fleet.finished()
        if finished and self.finished_at is None:
            self.finished_at = now
        elif not finished:
            self.finished_at = None
        return finished

    def status_lag(self, stored: set[str]) -> float:
        """Seconds from the shards holding every stored prompt to status saying finished."""
        return self.finished_at - max(self.shard_ids[pid] for pid in stored)

    def generated_twice(self) -> set[str]:
        return {pid for pid, n in Counter(self.stats()["generations"]).items() if n > 1}

    def generated_again(self) -> set[str]:
        """Generated more than once, though not generating when any fault began."""
        return self.generated_twice() - self.generating_at_faults


def _start(fleet: SentinelFleet, tmp_path: Path, records: list[dict], *enqueue_args: str) -> Watch:
    """Given a stand-in and two workers on the Sentinels (leases at their default), and the
    records enqueued through them."""
    _, url = fleet.standin(*STANDIN)
    fleet.worker("w1", [url])
    fleet.worker("w2", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)),
                   "--max-new-tokens", str(MAX_NEW_TOKENS), *enqueue_args)
    return Watch(url)


def _until_stored(fleet: SentinelFleet, watch: Watch, count: int) -> None:
    def stored() -> bool:
        watch.look(fleet)
        return len(watch.shard_ids) >= count
    wait_until(stored, 300, f"{count} prompts stored", fleet, poll=0.5)


def _until_finished(fleet: SentinelFleet, watch: Watch, timeout: float = 400) -> None:
    wait_until(lambda: watch.look(fleet), timeout, "status to say finished", fleet, poll=0.5)


def _figures(case: str, faults: int, watch: Watch, stored: set[str], dead: set[str], lag: float) -> None:
    path = os.environ.get("FLEET_FAILOVER_FIGURES")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"case": case, "faults": faults, "prompts": N, "stored": len(stored),
                                  "dead": len(dead), "generating_at_faults": len(watch.generating_at_faults),
                                  "generated_again": sorted(watch.generated_again()),
                                  "generated_twice_in_all": len(watch.generated_twice()),
                                  "status_lag_s": round(lag, 1)}) + "\n")


@pytest.mark.parametrize("case", ["kill", "freeze", "switchover"])
def test_a_failover_twice_mid_run_loses_nothing_runs_nothing_twice_and_status_catches_up(
        case, sfleet, topology, tokenizer, tmp_path):
    _through_faults(case, sfleet, topology, tokenizer, tmp_path)


@pytest.mark.parametrize("topology", [2], indirect=True, ids=["two-replicas"])
def test_a_switchover_twice_behind_two_replicas_loses_nothing_and_runs_nothing_twice(
        sfleet, topology, tokenizer, tmp_path):
    """With two replicas, the one not promoted still acknowledges the old primary's writes until the
    Sentinels tell it to follow the new one (its resync then drops them): no write of the fleet may
    count as confirmed on its word alone (`contract/redis_link/replication.py`). The loss window is short and
    a run may not meet it: `tests/specs/test_replication.py` holds the rule itself on two replicas."""
    _through_faults("switchover", sfleet, topology, tokenizer, tmp_path)


def _through_faults(case: str, sfleet, topology: Topology, tokenizer, tmp_path: Path) -> None:
    # Given a run on two workers, a share of it stored
    records = varied_prompts(N)
    watch = _start(sfleet, tmp_path, records)
    _until_stored(sfleet, watch, int(N * FAULT_AT))

    # When the fault strikes mid-run, and again once the topology has healed
    for _ in range(FAULTS):
        assert not watch.look(sfleet), "the run ended before the fault: more prompts are needed"
        watch.fault(FAULTS_BY_NAME[case], topology)
    _until_finished(sfleet, watch)

    # Then every prompt ends in one place, token-exact, and the export holds each stored id once
    stored, dead = _each_prompt_in_one_place(sfleet, tokenizer, tmp_path, records)
    lag = watch.status_lag(stored)
    _figures(case, FAULTS, watch, stored, dead, lag)
    # ...status caught up with the shards within seconds, not a lease...
    assert lag <= RECOVERY_S, f"status said finished {lag:.0f}s after the shards held every prompt"
    # ...and the stand-in generated again only what it was generating when a fault began
    _nothing_generated_again(watch, sfleet)


def test_a_switchover_during_conversations_loses_no_turn_and_generates_none_twice(
        sfleet, topology, tokenizer, tmp_path):
    # Given conversations regenerated turn by turn (`enqueue --turns all`) by two workers
    records = conversations(CONVERSATIONS)
    cfg = StandinConfig(output_len_median=60)
    expected = {f"{r['id']}#{t}": ids for r in records for t, ids in enumerate(replay(tokenizer, r, cfg))}
    _, url = sfleet.standin("--step-base", "0.01", "--output-len-median", "60", "--max-running-requests", "8")
    sfleet.worker("w1", [url])
    sfleet.worker("w2", [url])
    sfleet.producer("enqueue", str(write_prompts(tmp_path / "c.jsonl", records)), "--turns", "all",
                    "--max-new-tokens", str(TURN_TOKENS))
    watch = Watch(url)
    _until_stored(sfleet, watch, len(expected) // 3)

    # When an operator switches the primary over mid-run
    assert not watch.look(sfleet)
    watch.fault(switchover, topology)
    _until_finished(sfleet, watch)

    # Then every turn is stored once, exactly the regenerated history's prompt and the answer to it
    report = json.loads(sfleet.producer("status", "--json").stdout)
    assert report["finished"] and report["conversations"]["complete"] == CONVERSATIONS
    assert sfleet.states() == {"done": len(expected)} and sfleet.dead_letters() == []
    rows = sfleet.rows()
    assert {r["id"] for r in rows} == set(expected)
    assert all(row["input_ids"] == expected[row["id"]] for row in rows)
    _exported_once(sfleet, tmp_path, set(expected))
    # ...status caught up within seconds, and nothing was generated again but what was generating
    lag = watch.status_lag(set(expected))
    _figures("switchover, conversations", 1, watch, set(expected), set(), lag)
    assert lag <= RECOVERY_S, f"status said finished {lag:.0f}s after the shards held every turn"
    _nothing_generated_again(watch, sfleet)


def _nothing_generated_again(watch: Watch, fleet: SentinelFleet) -> None:
    """The stand-in generated again only what it was generating when a fault began: a switchover
    too, though the old primary takes writes until each worker's watch sees the new one (a prompt
    taken there in that second is generated only once a replica has its note). When it fails, it
    says what the workers logged of those prompts and of the failovers."""
    again = sorted(watch.generated_again())
    assert not again, f"generated again: {again}\n" + _logged(fleet, again)


def _logged(fleet: SentinelFleet, prompt_ids: list[str]) -> str:
    """The workers' log lines that name one of `prompt_ids` or tell of a failover."""
    marks = (*prompt_ids, "primary", "failover", "lease")
    lines = []
    for log in sorted(fleet.logs.glob("w*.log")):
        lines += [f"{log.stem}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if any(mark in line for mark in marks)]
    return "\n".join(lines[-80:])


@pytest.mark.parametrize("fault", ["switchover", "freeze"])
def test_flower_running_across_a_failover_hears_the_workers_again(sfleet, topology, tmp_path, fault):
    # Given Flower on the Sentinels, and a worker generating
    _, url = sfleet.standin("--step-base", "0.04", "--max-running-requests", "8")
    sfleet.worker("w1", [url])
    _, flower = start_flower(sfleet, FLOWER_BASIC_AUTH="fleet:secret")
    sfleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(60))),
                    "--max-new-tokens", str(MAX_NEW_TOKENS))
    name = f"w1@{socket.gethostname()}"
    wait_until(lambda: succeeded(flower, name) >= 1, 60, "Flower counting a task succeeded", sfleet)

    # When the primary is switched over by an operator, or frozen past down-after-milliseconds
    # (Sentinel closes the old primary's pub/sub connections when it demotes it: Flower's included)
    FAULTS_BY_NAME[fault](topology)
    healed = time.time()

    # Then Flower counts tasks that succeed after it (the worker's events reach it again) ...
    before = succeeded(flower, name)
    assert not sfleet.finished()
    wait_until(lambda: succeeded(flower, name) > before, 60, f"Flower counting a task after the {fault}", sfleet)
    # ... its workers view lists the worker online on a heartbeat heard after it ...
    wait_until(lambda: _heard_alive_since(flower, name, healed), 60, f"Flower hearing w1's heartbeat after the {fault}",
               sfleet)
    # ... and its API lists it online, with a fresh answer from the worker itself (`refresh`: Flower
    # asks the workers, through the new primary; the first ask after a failover can meet a pooled
    # connection Sentinel closed, and fails once, as an operator's refresh would)
    assert httpx.get(f"{flower}/api/workers", params={"status": 1}, auth=FLOWER_AUTH, timeout=10).json()[name] is True
    wait_until(lambda: _answered_since(flower, name, healed), 60, f"w1 answering Flower's inspect after the {fault}",
               sfleet)


FLOWER_AUTH = ("fleet", "secret")


def _answered_since(flower: str, worker: str, since: float) -> bool:
    """`/api/workers?refresh=1` (Flower inspects the workers) holds the worker's answer given after `since`."""
    listed = httpx.get(f"{flower}/api/workers", params={"refresh": 1}, auth=FLOWER_AUTH, timeout=30).json()
    return listed.get(worker, {}).get("timestamp", 0) > since


def _heard_alive_since(flower: str, worker: str, since: float) -> bool:
    """Flower's workers view (the dashboard's table: `/workers?json=1`) shows the worker online,
    with a heartbeat it received after `since`."""
    rows = httpx.get(f"{flower}/workers", params={"json": 1}, auth=FLOWER_AUTH, timeout=10).json()["data"]
    row = next((r for r in rows if r["hostname"] == worker), None)
    return bool(row and row["status"] and max(row.get("heartbeats") or [0]) > since)


def _each_prompt_in_one_place(fleet: SentinelFleet, tokenizer, tmp_path: Path,
                              records: list[dict]) -> tuple[set[str], set[str]]:
    states = fleet.states()
    assert sum(states.values()) == len(records) and set(states) <= {"done", "dead"}, states
    stored = {row["id"]: row for row in fleet.rows()}
    dead = {d["id"]: d for d in fleet.dead_letters()}
    assert set(stored) | set(dead) == {r["id"] for r in records} and not set(stored) & set(dead)
    assert all(d["reason"] for d in dead.values())
    cfg = parse_config(["--port", "1", *STANDIN])
    for record in records:
        if record["id"] in stored:
            ids = render(tokenizer, messages_of(record))
            output, _ = generate_output(ids, MAX_NEW_TOKENS, cfg)
            assert stored[record["id"]]["input_ids"] == ids + output, record["id"]
    _exported_once(fleet, tmp_path, set(stored))
    return set(stored), set(dead)


def _exported_once(fleet: SentinelFleet, tmp_path: Path, stored: set[str]) -> None:
    fleet.producer("export", str(tmp_path / "export"))
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    exported = [i for f in manifest["files"]
                for i in pq.read_table(tmp_path / "export" / f["name"], columns=["id"]).column("id").to_pylist()]
    assert sorted(exported) == sorted(stored)


def test_flower_and_status_work_through_a_sentinel_url(sfleet, tmp_path):
    # Given a worker and Flower on a Sentinel URL, and a few prompts enqueued through it
    _, url = sfleet.standin()
    sfleet.worker("w1", [url])
    _, flower = start_flower(sfleet, FLOWER_BASIC_AUTH="fleet:secret")
    sfleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(5))))

    # When they are stored
    assert sfleet.wait_finished() == {"done": 5}

    # Then status reads the run, and Flower sees the worker and the queue through the Sentinels
    report = json.loads(sfleet.producer("status", "--json").stdout)
    assert report["done"] == 5 and report["prompts"] == 5
    auth = ("fleet", "secret")
    wait_until(lambda: worker_online(flower, f"w1@{socket.gethostname()}"), 60, "worker online in Flower", sfleet)
    queues = httpx.get(f"{flower}/api/queues/length", auth=auth, timeout=10)
    assert queues.status_code == 200
    assert {q["name"]: q["messages"] for q in queues.json()["active_queues"]}.get("fleet.generate") == 0
