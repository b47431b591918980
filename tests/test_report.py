"""The run report (`python -m producer report`) in a real browser, and `python -m producer show`."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from producer.report.charts import CHARTS

from conftest import Fleet, varied_prompts, write_prompts
from waiting import wait_until

# Truncation and missing think-ends are stored (their rules are off), double think-ends and empty
# answers are dead-lettered: a run with every kind of bucket.
FAULTS = ("--output-len-max", "300", "--fault-truncate", "0.15", "--fault-missing-think-end", "0.1",
          "--fault-double-think-end", "0.1", "--fault-empty-answer", "0.1")
RULES_OFF = ("--disable-rule", "truncated", "--disable-rule", "missing_think_end")
THINK_END = 128822


def finished_run(fleet: Fleet, tmp_path: Path, n: int, *standin: str, rules: tuple = RULES_OFF) -> dict:
    """Given a stand-in with faults and a worker, n prompts generated to the end; returns status --json."""
    _, url = fleet.standin("--output-len-max", "150", *standin)  # under the budget, unless standin says more
    fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(n))),
                   "--max-new-tokens", "200", *rules, check=False)
    fleet.wait_finished()
    return json.loads(fleet.producer("status", "--json").stdout)


def open_report(fleet: Fleet, browser, out: Path, run: str = "default") -> dict:
    """`producer report` written to a file and opened from it; returns the page's embedded data."""
    fleet.producer("report", "--run", run, "--out", str(out))
    browser.get(out.as_uri())
    return browser.execute_script("return JSON.parse(document.getElementById('report-data').textContent)")


def rendered_charts(browser) -> list[dict]:
    """Per chart on the page: its name, its declared marks, and its marks the browser laid out with an area."""
    return browser.execute_script("""
        return Array.from(document.querySelectorAll('figure.chart')).map(f => {
          const svg = f.querySelector('svg'), box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
          const marks = Array.from(f.querySelectorAll('[id^="mark-' + f.dataset.chart + '-"]'));
          const drawn = marks.filter(m => { const b = m.getBoundingClientRect(); return b.width + b.height > 0; });
          return {name: f.dataset.chart, declared: Number(f.dataset.marks), marks: marks.length,
                  drawn: drawn.length, width: box.width, height: box.height,
                  caption: f.querySelector('p.healthy').textContent};
        });""")


def page_errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def shard_table(fleet: Fleet, run: str = "default"):
    files = sorted(p for p in (fleet.output_dir / run).glob("*.parquet") if not p.name.startswith((".", "_")))
    return pq.ParquetDataset(files).read()


def nearest_rank(values, q: float) -> int:
    return int(np.percentile(values, 100 * q, method="inverted_cdf"))


def test_the_report_draws_every_chart_in_a_browser_and_its_numbers_agree_with_status_and_the_shards(
        fleet, tmp_path, browser):
    # Given a finished run of 40 prompts with truncated, unclosed and dead-lettered generations
    status = finished_run(fleet, tmp_path, 40, *FAULTS)
    assert status["done"] and status["dead"], status

    # When its report is written and opened from the file in headless Chromium
    data = open_report(fleet, browser, tmp_path / "report.html")

    # Then every chart is on the page, says what healthy looks like, and drew all its data marks
    charts = rendered_charts(browser)
    assert [c["name"] for c in charts] == [c.name for c in CHARTS]
    for chart in charts:
        assert chart["width"] > 300 and chart["height"] > 100, chart
        assert chart["caption"].startswith("Healthy:"), chart
        assert chart["declared"] > 0 and chart["marks"] == chart["declared"] == chart["drawn"], chart
    assert page_errors(browser) == []
    # and the page fetched nothing: no resource was requested while it opened
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

    # And its counts are status --json's
    figures = data["figures"]
    for key in ("prompts", "done", "dead", "dead_by_reason", "output_tokens", "prompt_tokens"):
        assert data["status"][key] == status[key], key
    assert figures["samples"]["unique_ids"] == status["done"] == figures["samples"]["rows"]
    assert figures["dead_letters"]["by_reason"] == status["dead_by_reason"]
    cards = {e.get_attribute("data-figure"): e.text for e in browser.find_elements("css selector", ".card b")}
    assert cards["stored"] == f"{status['done']:,}" and cards["dead letters"] == f"{status['dead']:,}"

    # And its figures are what the test computes from the shards itself
    table = shard_table(fleet)
    output_len = table["output_len"].to_numpy()
    closed = table.filter(pc.is_valid(table["think_end_index"]))
    reasoning = pc.subtract(closed["think_end_index"], closed["prompt_len"]).to_numpy()
    answer = output_len[pc.is_valid(table["think_end_index"]).to_numpy()] - reasoning - 1
    for name, values in (("output", output_len), ("reasoning", reasoning), ("answer", answer)):
        got = figures["lengths"][name]
        assert (got["n"], got["total"], got["max"]) == (len(values), int(values.sum()), int(values.max())), name
        assert (got["p50"], got["p90"]) == (nearest_rank(values, 0.5), nearest_rank(values, 0.9)), name
        assert sum(got["histogram"]["counts"]) == len(values)
    assert sum(output_len) == status["output_tokens"]
    assert figures["budget"] == 200
    finish = Counter(table["finish_reason"].to_pylist())
    assert figures["finish"]["stored"] == dict(finish) and finish["length"] > 0
    assert figures["closure"]["stored"] == {"one": len(closed), "none": table.num_rows - len(closed)}
    assert figures["quality"]["counts"]["truncated"] == finish["length"]
    assert figures["quality"]["counts"]["unclosed"] == table.num_rows - len(closed) > 0
    servers = Counter(table["server"].to_pylist())
    assert {s["server"]: s["samples"] for s in figures["servers"]} == dict(servers)
    assert sum(s["output_tokens"] for s in figures["servers"]) == int(output_len.sum())
    assert sum(figures["timeline"]["samples"]) == table.num_rows
    said = [(p, c) for p, c in zip(table["prompt_len"].to_pylist(), table["cached_tokens"].to_pylist())
            if c is not None]  # prefix-cache hits: over the rows whose server said
    assert said and (figures["cache"]["known_prompt_tokens"], figures["cache"]["cached_tokens"]) == (
        sum(p for p, _ in said), sum(c for _, c in said))

    # And the examples are embedded: shortest, longest, truncated, and one per dead-letter reason
    examples = figures["examples"]
    lengths = dict(zip(table["id"].to_pylist(), output_len))  # among equal lengths the report keeps the smallest ids
    assert examples["longest"][0] == min(i for i, o in lengths.items() if o == output_len.max())
    assert int(output_len.min()) in [o for i, o in zip(table["id"].to_pylist(), output_len) if i in examples["shortest"]]
    assert set(examples["truncated"]) <= set(pc.filter(table["id"], pc.equal(table["finish_reason"], "length")).to_pylist())
    assert {k[5:] for k in examples if k.startswith("dead:")} == set(status["dead_by_reason"])
    shown = {e.get_attribute("data-example") for e in browser.find_elements("css selector", "details[data-example]")}
    assert {i for ids in examples.values() for i in ids} == shown
    details = browser.find_element("css selector", f"details[data-example='{examples['longest'][0]}']")
    browser.find_element("css selector", f"a[href='#{details.get_attribute('id')}']").click()
    # (the page opens it on `hashchange`, an event the browser fires after the click returns)
    wait_until(lambda: details.get_attribute("open") is not None, 10, "the linked example to open")
    assert "── reasoning" in details.text and "── answer" in details.text and "</think>" in details.text

    # And a screenshot shows it (kept beside the test's files)
    browser.set_window_size(1400, 2400)
    assert browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 50_000


def test_the_report_of_an_enqueued_run_with_nothing_finished_renders_without_errors(fleet, tmp_path, browser):
    # Given a run enqueued with no worker to take it
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(5))))

    # When its report is opened
    data = open_report(fleet, browser, tmp_path / "empty.html")

    # Then every chart is there (saying there is nothing yet), with no error, and the counts say so
    charts = rendered_charts(browser)
    assert [c["name"] for c in charts] == [c.name for c in CHARTS]
    assert all(c["width"] > 300 and c["height"] > 100 for c in charts)
    assert page_errors(browser) == []
    assert data["status"]["pending"] == 5 and data["figures"]["samples"]["rows"] == 0
    assert "no samples yet" in browser.find_element("id", "chart-output_length").text


def test_the_report_of_a_run_with_only_dead_letters_renders_them(fleet, tmp_path, browser):
    # Given a run whose every generation has two think-ends (all dead-lettered)
    status = finished_run(fleet, tmp_path, 6, "--fault-double-think-end", "1.0", rules=())
    assert status["done"] == 0 and status["dead_by_reason"] == {"multiple_think_end": 6}

    # When its report is opened
    data = open_report(fleet, browser, tmp_path / "dead.html")

    # Then it renders without error, with the dead letters charted and an example of their reason
    assert page_errors(browser) == []
    charts = {c["name"]: c for c in rendered_charts(browser)}
    assert charts["dead_letters_over_time"]["drawn"] == charts["dead_letters_over_time"]["declared"] > 0
    assert data["figures"]["finish"]["dead"] == {"stop": 6}
    assert data["figures"]["closure"]["dead"] == {"several": 6}
    example = data["figures"]["examples"]["dead:multiple_think_end"][0]
    text = browser.find_element("css selector", f"details[data-example='{example}']").get_attribute("textContent")
    assert "multiple_think_end" in text and "── prompt" in text


def test_show_decodes_a_stored_sample_split_at_think_end_with_special_tokens_and_provenance(
        fleet, tmp_path, tokenizer):
    # Given a finished run
    finished_run(fleet, tmp_path, 4, rules=())
    row = next(r for r in fleet.rows() if r["think_end_index"] is not None)
    ids, prompt_len, end = row["input_ids"], row["prompt_len"], row["think_end_index"]

    # When one sample is shown, with and without its ids
    text = fleet.producer("show", row["id"]).stdout
    with_ids = fleet.producer("show", row["id"], "--ids").stdout

    # Then it has the prompt as the template rendered it, the reasoning and the answer split at think-end
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    sections = text.split("── ")
    prompt = next(s for s in sections if s.startswith("prompt ("))
    reasoning = next(s for s in sections if s.startswith("reasoning ("))
    answer = next(s for s in sections if s.startswith("answer ("))
    assert decode(ids[:prompt_len]) in prompt and "<｜Assistant｜><think>" in prompt
    assert decode(ids[prompt_len:end]) in reasoning and decode(ids[end + 1:]) in answer
    assert f"reasoning ({end - prompt_len} tokens" in reasoning
    assert f"answer ({len(ids) - end - 1} tokens" in answer and "<｜end▁of▁sentence｜>" in answer
    # with its provenance
    for column in ("server", "worker", "finish_reason", "tokenizer", "template", "shard"):
        assert f"  {column}" in text, column
    assert row["server"] in text and row["worker"] in text
    # and, with --ids, one line per token: position and id
    lines = {tuple(line.split()[:2]) for line in with_ids.splitlines() if line.startswith("  ")}
    assert all((str(pos), str(tid)) in lines for pos, tid in enumerate(ids))
    assert (str(end), str(THINK_END)) in lines


def test_show_decodes_a_dead_letter_and_refuses_an_unknown_id(fleet, tmp_path, tokenizer):
    # Given a run whose prompts are all dead-lettered with two think-ends
    finished_run(fleet, tmp_path, 2, "--fault-double-think-end", "1.0", rules=())
    letter = fleet.dead_letters()[0]
    full = json.loads(fleet.producer("dead", "show", letter["id"], "--json").stdout)

    # When it is shown
    text = fleet.producer("show", letter["id"]).stdout

    # Then its prompt is decoded, with its reason, message and output excerpt
    prompt_ids = full["prompt_ids"]
    assert tokenizer.decode(prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) in text
    assert "multiple_think_end" in text and letter["message"] in text
    assert f"prompt ({len(prompt_ids)} tokens" in text and "── output" in text
    assert text.count("</think>") >= 2 or "excerpt think_end" in text

    # And an id the run does not have is refused
    missing = fleet.producer("show", "no-such-id", check=False)
    assert missing.returncode == 1 and "no sample or dead letter" in missing.stderr

