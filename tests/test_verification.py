"""Verification while the run goes on (`enqueue --verify`), with real processes: a Celery worker
against the SGLang stand-in checks each answer with the run's verifier, stores every sample with its
verdict, and a verifier that raises, hangs or kills its process costs that sample an `error` verdict,
never the worker."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from sglang_standin.cli import parse_config
from sglang_standin.outputs import generate_output

from conftest import ROOT, render, write_prompts

MAX_NEW_TOKENS = 4096
THINK_END, EOS = 128822, 1

CHECKS = textwrap.dedent("""
    import os, time

    def grade(fields, answer):
        how = fields.get("how")
        if how == "raise":
            raise RuntimeError("verifier bug on " + fields["id"])
        if how == "hang":
            time.sleep(3600)
        if how == "die":
            os._exit(3)
        same = answer == fields["answer"]
        return same, "same" if same else "differs"
""")


def the_answer(tokenizer, text: str) -> str:
    """What the stand-in answers to a one-turn prompt, as the verifier reads it: the output after
    think-end, without its stop token, decoded and stripped."""
    output, _ = generate_output(render(tokenizer, [{"role": "user", "content": text}]), MAX_NEW_TOKENS,
                                parse_config(["--port", "1"]))
    after = output[output.index(THINK_END) + 1:]
    return tokenizer.decode(after[:-1] if after[-1:] == [EOS] else after, skip_special_tokens=False).strip()


def lines(tokenizer, hows: list[str], prefix: str = "q") -> list[dict]:
    """A prompt per entry: `right` carries the stand-in's own answer, `wrong` another, `raise`,
    `hang` and `die` tell the check to do so."""
    records = []
    for i, how in enumerate(hows):
        text = f"Question {prefix}{i}: what is {i} + {i}?"
        answer = the_answer(tokenizer, text) if how == "right" else "not this"
        records.append({"id": f"{prefix}{i}", "prompt": text, "answer": answer, "how": how})
    return records


def checks_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "checks"
    folder.mkdir()
    (folder / "my_checks.py").write_text(CHECKS)
    return folder


def verdicts(fleet, run: str = "default") -> dict[str, tuple]:
    return {r["id"]: (r["verified"], r["verdict"]) for r in fleet.rows(run)}


def test_a_verifier_that_raises_costs_its_sample_an_error_verdict_and_the_sample_is_stored(fleet, tokenizer, tmp_path):
    # Given a worker whose Python finds the user's verifier module, and prompts whose check passes, fails or raises
    checks = checks_folder(tmp_path)
    _, url = fleet.standin()
    worker = fleet.worker("w1", [url], PYTHONPATH=f"{ROOT}{os.pathsep}{checks}")
    hows = ["right"] * 5 + ["wrong"] * 4 + ["raise"] * 3
    prompts = write_prompts(tmp_path / "p.jsonl", lines(tokenizer, hows))

    # When the run is enqueued with that verifier and the fleet drains it
    fleet.producer("enqueue", str(prompts), "--verify", "my_checks:grade", "--max-new-tokens", str(MAX_NEW_TOKENS),
                   PYTHONPATH=f"{ROOT}{os.pathsep}{checks}")
    states = fleet.wait_finished()

    # Then every sample is stored, none dead-lettered, each with its verdict: the raising ones as errors
    assert states == {"done": 12} and fleet.dead_letters() == []
    found = verdicts(fleet)
    assert {found[f"q{i}"] for i in range(5)} == {(True, "same")}
    assert {found[f"q{i}"] for i in range(5, 9)} == {(False, "differs")}
    assert [found[f"q{i}"] for i in range(9, 12)] == [(False, f"error: RuntimeError: verifier bug on q{i}")
                                                       for i in range(9, 12)]
    assert worker.alive() and "marking its" not in worker.tail(5000)  # each group marked done as it was written
    # and status counts them by verdict, with the pass rate and the samples spent per verified one
    status = json.loads(fleet.producer("status", "--json").stdout)
    assert status["verification"] == {"verifier": "my_checks:grade", "passed": 5, "failed": 4, "error": 3,
                                      "checked": 12, "pass_rate": round(5 / 12, 4), "samples_per_verified": 2.4}
    assert "verification (my_checks:grade)" in fleet.producer("status", COLUMNS="200").stdout
    # and so does the run report, on its cards and in its data
    fleet.producer("report", "--out", str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    data = json.loads(page.split("id='report-data'>", 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    assert data["status"]["verification"] == status["verification"]
    assert "data-figure='pass rate'>41.7%<" in page and "data-figure='samples per verified'>2.40<" in page
    # and `show` prints a sample's verdict
    shown = fleet.producer("show", "q9", COLUMNS="300").stdout
    assert "error: RuntimeError: verifier bug on q9 (not passed my_checks:grade)" in shown

    # When the run is exported with --verified-only
    result = fleet.producer("export", str(tmp_path / "dest"), "--verified-only")

    # Then the export holds the five that passed, and says what it left out by verdict
    manifest = json.loads((tmp_path / "dest" / "manifest.json").read_text())
    assert manifest["rows"] == 5 and manifest["verified_only"] is True
    assert manifest["left_out"] == {"verdict:error": 3, "verdict:fail": 4}
    assert "verdict:error=3" in result.stdout


def test_a_verifier_that_hangs_or_dies_costs_its_sample_an_error_verdict_and_the_worker_goes_on(fleet, tokenizer,
                                                                                              tmp_path):
    # Given a worker with one check process and a 2-second limit on a check
    checks = checks_folder(tmp_path)
    _, url = fleet.standin()
    path = f"{ROOT}{os.pathsep}{checks}"
    worker = fleet.worker("w1", [url], PYTHONPATH=path, FLEET_VERIFY_TIMEOUT_SECONDS="2", FLEET_VERIFY_PROCESSES="1")
    first = write_prompts(tmp_path / "first.jsonl", lines(tokenizer, ["hang", "right", "die", "hang", "right"]))

    # When a run's checks hang (sleep forever) or kill their process
    fleet.producer("enqueue", str(first), "--verify", "my_checks:grade", "--max-new-tokens", str(MAX_NEW_TOKENS),
                   PYTHONPATH=path)
    assert fleet.wait_finished() == {"done": 5}

    # Then those samples are stored with an error verdict (the hung ones after the limit), the others checked
    found = verdicts(fleet)
    assert found["q0"] == found["q3"] == (False, "error: timeout after 2s")
    assert found["q2"][0] is False and found["q2"][1].startswith("error: the verifier's process died")
    assert found["q1"] == found["q4"] == (True, "same")
    assert fleet.dead_letters() == []

    # When more prompts come after them
    more = write_prompts(tmp_path / "more.jsonl", lines(tokenizer, ["right", "wrong", "right"], prefix="m"))
    fleet.producer("enqueue", str(more), "--verify", "my_checks:grade", "--max-new-tokens", str(MAX_NEW_TOKENS),
                   PYTHONPATH=path)

    # Then the same worker process checks and stores them as usual
    assert fleet.wait_finished() == {"done": 8}
    found = verdicts(fleet)
    assert (found["m0"], found["m1"], found["m2"]) == ((True, "same"), (False, "differs"), (True, "same"))
    assert worker.alive()
    counters = fleet.counters()
    assert (counters["verdict:pass"], counters["verdict:fail"], counters["verdict:error"]) == (4, 1, 3)


def test_the_math_verifier_runs_in_a_real_worker(fleet, tmp_path):
    # Given a worker, and a run checked by `math` whose answers (the stand-in's random tokens) hold no \\boxed{}
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"m{i}", "prompt": f"What is {i}/2?", "answer": f"{i / 2}"}
                                                   for i in range(3)])

    # When it is drained
    fleet.producer("enqueue", str(prompts), "--verify", "math", "--max-new-tokens", str(MAX_NEW_TOKENS))
    assert fleet.wait_finished() == {"done": 3}

    # Then each sample is stored as failed for want of a boxed answer
    assert set(verdicts(fleet).values()) == {(False, "no_boxed")}
