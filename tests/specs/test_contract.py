"""The contract's names: run names, reason codes, key layout, kombu's internals, imports.

These are what other processes (an older worker, a dashboard, a script that
reads `dead list --json`) rely on, so each is pinned here.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.keys import RunKeys, queue_for, task_id
from contract.names import Reason
from contract.redis_link.scripts import Lua
from contract.run.spec import BadRunName, OlderLayout, RunSpec, check_run_name, load_spec, run_queues, save_spec

ROOT = Path(__file__).resolve().parents[2]


# Run names become Redis key parts and folders under OUTPUT_DIR.
@pytest.mark.parametrize("name", ["default", "run-2026.12.01", "R_1", "A_b-c.d", "7", "a" * 128])
def test_a_safe_run_name_is_accepted(name):
    assert check_run_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "../../x", "a/../b", "/abs/path", "a/b", "a\\b", "..", "a..b",
                                  ".hidden", "-flag", "a:b", "a b", "a\nb", "x\n", "a*", "a" * 129, "é"], ids=repr)
def test_a_run_name_that_could_escape_or_collide_is_refused(name):
    with pytest.raises(BadRunName, match="is not allowed"):
        check_run_name(name)


def test_the_key_layout_is_pinned():
    keys = RunKeys("r")
    assert (keys.spec, keys.state_bucket(7), keys.dead, keys.token_ids) == (
        "fleet:run:r", "fleet:run:r:s:7", "fleet:run:r:dead", "fleet:run:r:ids")
    assert queue_for("fleet.generate", None) == "fleet.generate"
    assert queue_for("fleet.generate", "m") == "fleet.generate@m"
    assert task_id("r", "p-1") == "r:p-1"


def _spec(name: str) -> RunSpec:
    return RunSpec(name=name, tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="t", sampling={},
                   thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3])


OLDER_LAYOUTS = {
    # a spec written before specs recorded the key layout
    "no layout in its spec": lambda c, r: c.set(f"fleet:run:{r}", _spec(r).to_json().replace('"layout": 1, ', "")),
    # prompts' states in one hash keyed by id, as before the state buckets
    "one state hash": lambda c, r: c.hset(f"fleet:run:{r}:state", "p-1", "queued"),
    # prompts counted, but not by state, as before the state counts
    "no state counts": lambda c, r: c.hset(f"fleet:run:{r}:counters", mapping={"enqueued": 2, "done": 5}),
}


@pytest.mark.parametrize("shape", sorted(OLDER_LAYOUTS))
def test_a_run_an_older_layout_wrote_is_refused_with_what_to_do(client, shape):
    # Given a run written by an older layout beside one of this version's
    new = _spec("new")
    save_spec(client, _spec("old"))
    save_spec(client, new)
    OLDER_LAYOUTS[shape](client, "old")

    # When its spec is read, then it is refused, saying what to do instead
    with pytest.raises(OlderLayout, match=r"run 'old' was written by an older version .*new run name"):
        load_spec(client, "old")
    # and the queues a worker consumes and audits leave it out, the other run still there
    assert run_queues(client, "q") == {"new": "q"} and load_spec(client, "new") == new


def test_a_script_reads_its_arguments_by_name(client):
    # Given a script of two single arguments and a record of two per prompt
    echo = Lua("""
local out = {a.run, a.call}
for _, p in ipairs(prompts) do out[#out + 1] = p.id .. '=' .. p.tokens end
return out
""", head=("run", "call"), each=("id", "tokens"))

    # When it is called with the single ones by name, in another order, then it reads each by its name
    assert echo(client, [], {"call": "c1", "run": "r"}, [("p1", 3), ("p2", 4)]) == [b"r", b"c1", b"p1=3", b"p2=4"]
    # and a record of the wrong width is refused before anything is sent
    with pytest.raises(ValueError, match="has 1 values"):
        echo.argv({}, [("p1",)])


def test_every_reason_code_says_what_it_means():
    # Given the reason codes, then each has the meaning the documentation's reference shows
    from contract.names import MEANINGS

    assert [r.value for r in Reason if not MEANINGS.get(r, "").strip()] == []


def test_a_reason_is_its_own_value_in_json_and_text():
    import json

    assert json.dumps({"reason": Reason.TRUNCATED}) == '{"reason": "truncated"}'
    assert f"{Reason.TRUNCATED}" == "truncated" == str(Reason.TRUNCATED)


@pytest.mark.parametrize("module, forbidden", [
    ("producer.cli", ("celery", "kombu", "workers", "pyarrow", "httpx", "transformers")),
    ("workers", ("celery", "kombu", "pyarrow", "httpx")),
    ("contract.ledger.ledger", ("celery", "pyarrow", "httpx")),
])
def test_importing_an_entry_module_builds_nothing(module, forbidden):
    code = (f"import sys, {module}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(forbidden)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_celery_finds_the_app_in_workers_celery():
    code = "from celery.app.utils import find_app; print(find_app('workers').main)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "workers"
