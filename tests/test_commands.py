"""Commands as a user meets them: never a count from shards they could not read, each run's own
counts, values checked, the demo's next steps, and hostile text kept as text."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from conftest import ROOT, Fleet, varied_prompts, write_prompts, zygote
from waiting import wait_until

RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def producer_elsewhere(fleet: Fleet, cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """`python -m producer ARGS` run from another folder, with REDIS_URL but no OUTPUT_DIR
    unless `extra` sets one: a user on another machine that reaches Redis and the storage."""
    env = {k: v for k, v in fleet.env(**extra).items() if k != "OUTPUT_DIR" or "OUTPUT_DIR" in extra}
    cwd.mkdir(parents=True, exist_ok=True)
    return zygote().run(list(args), env, cwd, timeout=600)


def finished(fleet: Fleet, tmp_path: Path, n: int, *enqueue: str, run: str = "default") -> dict:
    fleet.producer("enqueue", str(write_prompts(tmp_path / f"{run}.jsonl", varied_prompts(n, run))), "--run", run,
                   "--max-new-tokens", "200", *enqueue, check=False)
    return fleet.wait_finished(run)


def test_commands_read_the_shards_where_the_workers_wrote_them(fleet, tmp_path):
    # Given a run of 12 prompts stored by a worker writing to its OUTPUT_DIR
    _, url = fleet.standin("--output-len-max", "150")
    fleet.worker("w1", [url])
    assert finished(fleet, tmp_path, 12) == {"done": 12}
    elsewhere = tmp_path / "elsewhere"

    # When a user elsewhere, with REDIS_URL only, lists the runs, exports, reports and shows a sample
    runs = json.loads(producer_elsewhere(fleet, elsewhere, "runs", "--json").stdout)
    export = producer_elsewhere(fleet, elsewhere, "export", str(tmp_path / "dataset"))
    report = producer_elsewhere(fleet, elsewhere, "report", "--out", str(tmp_path / "r.html"))
    show = producer_elsewhere(fleet, elsewhere, "show", "default-0003")

    # Then each reads the shards where the workers wrote them, and finds every sample
    (default,) = runs
    assert default["shards"] == [str(fleet.output_dir.resolve())] and default["done"] == 12
    assert export.returncode == 0 and "exported 12 samples" in export.stdout, export.stderr
    manifest = json.loads((tmp_path / "dataset" / "manifest.json").read_text())
    assert manifest["rows"] == 12 and manifest["done_not_exported"] == 0
    assert report.returncode == 0 and "(12 samples" in report.stdout, report.stderr
    assert show.returncode == 0 and show.stdout.startswith("sample default-0003"), show.stderr


def test_a_command_that_finds_fewer_samples_than_done_fails_saying_where_it_looked(fleet, tmp_path):
    # Given a finished run of 12 prompts, and a previous export of it
    _, url = fleet.standin("--output-len-max", "150")
    fleet.worker("w1", [url])
    assert finished(fleet, tmp_path, 12) == {"done": 12}
    dest = tmp_path / "dataset"
    fleet.producer("export", str(dest))
    before = sorted(p.name for p in dest.iterdir())
    wrong = tmp_path / "not-the-shards"
    wrong.mkdir()

    # When export, report and show are pointed at another OUTPUT_DIR than the workers'
    results = [fleet.producer(*command, check=False, OUTPUT_DIR=str(wrong)) for command in
               (["export", str(dest)], ["report", "--out", str(tmp_path / "r.html")], ["show", "default-0001"])]

    # Then each fails with one line that says how many are done, how many were found, and where it looked
    for result in results:
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert str(wrong / "default") in result.stderr
    assert "counts 12 samples done, but 0 were found" in results[0].stderr
    assert "counts 12 samples done, but 0 were found" in results[1].stderr
    assert "'default-0001'" in results[2].stderr and "done in the ledger" in results[2].stderr
    # and nothing was written: the previous export stands, and no report page
    assert sorted(p.name for p in dest.iterdir()) == before and not (tmp_path / "r.html").exists()

    # And when a shard cannot be read (a copy of the shards, one of them corrupt), each says so in one line
    copy = tmp_path / "copy"
    shutil.copytree(fleet.output_dir, copy)
    next(copy.glob("default/*.parquet")).write_bytes(b"not parquet")
    for command in (["export", str(dest)], ["report", "--out", str(tmp_path / "r.html")], ["show", "default-0001"]):
        result = fleet.producer(*command, check=False, OUTPUT_DIR=str(copy))
        assert result.returncode == 1 and result.stderr.strip().startswith(f"cannot read the shards under {copy}"), \
            result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr

    # And when one of the workers' own shards is gone, export and report say so too
    shards = sorted(fleet.output_dir.glob("default/*.parquet"))
    lost = set(pq.read_table(shards[0], columns=["id"]).column("id").to_pylist())
    shards[0].unlink()
    export = fleet.producer("export", str(dest), check=False)
    report = fleet.producer("report", "--out", str(tmp_path / "r.html"), check=False)
    show = fleet.producer("show", sorted(lost)[0], check=False)
    for result in (export, report, show):
        assert result.returncode == 1 and str(fleet.output_dir / "default") in result.stderr, result.stderr
    assert f"but {12 - len(lost)} were found" in export.stderr and f"but {12 - len(lost)} were found" in report.stderr


def test_status_counts_only_its_own_runs_prompts(fleet, tmp_path):
    # Given two runs sharing the one queue, 3 prompts and 2, and no worker yet
    fleet.producer("enqueue", str(write_prompts(tmp_path / "a.jsonl", varied_prompts(3, "a"))), "--run", "a")
    fleet.producer("enqueue", str(write_prompts(tmp_path / "b.jsonl", varied_prompts(2, "b"))), "--run", "b")

    # When each run's status is asked for
    a = json.loads(fleet.producer("status", "--json", "--run", "a").stdout)
    b = json.loads(fleet.producer("status", "--json", "--run", "b").stdout)

    # Then each counts its own prompts queued, and the queue's depth (both runs') is shown apart
    assert (a["prompts"], a["queued"], a["in_flight"]) == (3, 3, 0)
    assert (b["prompts"], b["queued"], b["in_flight"]) == (2, 2, 0)
    assert a["queue_depth"] == b["queue_depth"] == 5
    assert "5 messages of every run on it" in fleet.producer("status", "--run", "a").stdout

    # And once a worker holds them all (each generation takes a minute), each run's are in flight
    _, url = fleet.standin("--fault-slow", "1.0", "--slow-seconds", "60")
    fleet.worker("w1", [url], FLEET_SHUTDOWN_GRACE="1")

    def both_in_flight() -> bool:
        counts = [json.loads(fleet.producer("status", "--json", "--run", run).stdout) for run in ("a", "b")]
        return [(c["queued"], c["in_flight"]) for c in counts] == [(0, 3), (0, 2)]

    wait_until(both_in_flight, 60, "each run's prompts in flight", fleet)


def test_values_outside_an_options_set_are_refused_and_nothing_is_recorded(fleet, tmp_path):
    # Given a prompt file, a run with dead letters, and Redis
    _, url = fleet.standin("--output-len-max", "150")
    fleet.worker("w1", [url])
    finished(fleet, tmp_path, 4, "--max-new-tokens", "1")  # each generation truncated
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(2))

    # When options get values outside their sets
    results = {tuple(args): fleet.producer(*args, check=False) for args in (
        ["enqueue", str(prompts), "--run", "maybe", "--thinking", "maybe"],
        ["dead", "requeue", "--reason", "truncted", "--yes"],
        ["dead", "list", "--reason", "bogus"],
        ["dead", "purge", "--reason", "truncted", "--yes"])}

    # Then each is refused (exit 2), listing the valid values, and nothing is recorded or replayed
    for args, result in results.items():
        assert result.returncode == 2 and "is not one of" in result.stderr, (args, result.stderr)
    assert "auto, prompt, output, off" in results[tuple(results)[0]].stderr
    runs = json.loads(fleet.producer("runs", "--json").stdout)
    assert [r["run"] for r in runs] == ["default"]
    assert fleet.states() == {"dead": 4} and len(fleet.dead_letters()) == 4
    # and a run that does not exist is refused naming the runs there are
    missing = fleet.producer("status", "--run", "nope", check=False)
    assert missing.returncode == 2 and "runs there: default" in missing.stderr


def test_a_newcomers_first_mistakes_are_one_line_each_never_a_traceback(fleet, tmp_path):
    # Given a prompt file, an empty one, and a Redis
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(2))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")

    # When `python -m producer enqueue` is given a tokenizer that is nowhere, offline and online, or no prompts
    missing_folder = fleet.producer("enqueue", str(prompts), "--tokenizer", "./no-such-dir", check=False,
                                    HF_HUB_OFFLINE="0")
    # (not forked from the zygote: it imported huggingface_hub, which reads HF_HUB_OFFLINE once, at import)
    missing_id = subprocess.run([sys.executable, "-m", "producer", "enqueue", str(prompts), "--tokenizer",
                                 "no-such-org/no-such-model"], env=fleet.env(HF_HUB_OFFLINE="1"), cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
    nothing = fleet.producer("enqueue", str(empty), check=False)

    # Then each prints one line on stderr, nothing on stdout, and exits 2 (what was asked) or 1 (no prompts)
    for result, code, start in ((missing_folder, 2, "tokenizer './no-such-dir' not found"),
                                (missing_id, 2, "tokenizer 'no-such-org/no-such-model' not found"),
                                (nothing, 1, f"no prompts in {empty}")):
        assert result.returncode == code, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(start) and result.stdout == "", result
    # and no run was recorded
    assert json.loads(fleet.producer("runs", "--json").stdout) == []


HOSTILE = ["\x1b]0;PWNED\x07", "\x1b[2J", "\x9b31m", "\u202e"]


def test_hostile_text_from_prompts_answers_and_dead_letters_is_shown_escaped(fleet, tmp_path):
    # Given prompts whose ids and texts hold terminal control sequences: one run stored,
    # one whose every generation is truncated into a dead letter
    _, url = fleet.standin("--output-len-max", "150")
    fleet.worker("w1", [url])
    records = [{"id": f"evil{n}{seq}", "prompt": f"hello {seq} world {seq}"} for n, seq in enumerate(HOSTILE)]
    for run, budget in (("kept", "200"), ("dead", "1")):
        fleet.producer("enqueue", str(write_prompts(tmp_path / f"{run}.jsonl", records)), "--run", run,
                       "--max-new-tokens", budget)
        fleet.wait_finished(run)
    assert fleet.states("kept") == {"done": 4} and fleet.states("dead") == {"dead": 4}
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"id": "x\\u001b[2J", "prompt": "a"}\n' * 2)  # a repeated id is reported by its id

    # When every command that prints their text prints it
    outputs = {}
    for n, seq in enumerate(HOSTILE):
        outputs[f"show kept {n}"] = fleet.producer("show", f"evil{n}{seq}", "--run", "kept", "--ids")
        outputs[f"show dead {n}"] = fleet.producer("show", f"evil{n}{seq}", "--run", "dead")
        outputs[f"dead show {n}"] = fleet.producer("dead", "show", f"evil{n}{seq}", "--run", "dead")
        outputs[f"dead show json {n}"] = fleet.producer("dead", "show", f"evil{n}{seq}", "--run", "dead", "--json")
    outputs["dead list"] = fleet.producer("dead", "list", "--run", "dead")
    outputs["status"] = fleet.producer("status", "--run", "dead")
    outputs["enqueue"] = fleet.producer("enqueue", str(bad_line), "--run", "bad", check=False)

    # Then no control character reaches the terminal raw, and each is shown as its escape
    for what, result in outputs.items():
        assert not RAW_CONTROLS.search(result.stdout + result.stderr), (what, result.stdout, result.stderr)
        assert "\u202e" not in result.stdout + result.stderr, what
    assert "hello \\x1b]0;PWNED\\x07 world" in outputs["show kept 0"].stdout
    assert "sample evil1\\x1b[2J" in outputs["show kept 1"].stdout
    assert "dead letter evil3\\u202e" in outputs["dead show 3"].stdout
    assert "evil2\\x9b31m" in outputs["dead list"].stdout
    assert "x\\x1b[2J" in outputs["enqueue"].stderr
    assert json.loads(outputs["dead show json 0"].stdout)["id"] == "evil0" + HOSTILE[0]


def test_the_demos_next_steps_work_as_printed(tmp_path):
    # Given the demo, run on a few prompts with nothing configured (no REDIS_URL, SGLANG_URLS, OUTPUT_DIR)
    prompts = write_prompts(tmp_path / "few.jsonl", varied_prompts(12))
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "SGLANG_URLS", "OUTPUT_DIR", "FLEET_RUN")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="80")
    demo = subprocess.run([sys.executable, "-m", "producer", "demo", "--prompts", str(prompts), "--workdir",
                           str(tmp_path / "demo-run")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    kept = json.loads((tmp_path / "demo-run" / "redis" / "server.json").read_text())
    try:
        assert demo.returncode == 0, demo.stdout + demo.stderr

        # When the commands it prints at its end are run as printed, after it has ended
        lines = demo.stdout.split("try next:")[1].splitlines()
        commands = [line.strip() for line in lines if line.startswith("  ") and not line.strip().startswith("#")]
        assert len(commands) >= 4 and all(re.match(r"REDIS_URL=\S+ \S*python\S* -m producer ", c) for c in commands)
        results = [subprocess.run(c, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
                   for c in commands]

        # Then each works, on the demo's run, and reads its shards where its worker wrote them
        for command, result in zip(commands, results):
            assert result.returncode == 0, (command, result.stdout, result.stderr)
        status = next(r for c, r in zip(commands, results) if " status " in c + " ")
        assert "run 'demo'" in status.stdout and "done" in status.stdout
        export = next(r for c, r in zip(commands, results) if " export " in c)
        assert "exported" in export.stdout and str(tmp_path / "demo-run" / "shards" / "demo") in export.stdout
        # and its output echoed commands with their interpreter, and ended with a summary
        assert re.search(r"^\$ \S*python\S* -m producer enqueue ", demo.stdout, re.M)
        assert re.search(r"^summary: \d+ samples stored, \d+ dead letters", demo.stdout, re.M)
        assert "…" not in demo.stdout
        # and its worker logged start-up, bindings and health at INFO, and ended saying it stopped cleanly
        log = (tmp_path / "demo-run" / "logs" / "demo-worker.log").read_text().splitlines()
        for event in (" bound to ", "metrics on ", "waiting to consume: no healthy server yet", " -> healthy ",
                      " ready: model=", "consuming from fleet.generate"):
            assert [line for line in log if event in line and "INFO/" in line], event
        assert not [line for line in log if "consuming from nothing" in line]
        assert "INFO/MainProcess] worker stopped cleanly: samples in shards" in log[-1], log[-5:]
    finally:
        os.kill(kept["pid"], signal.SIGTERM)
