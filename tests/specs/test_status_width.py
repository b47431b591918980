"""Specs of `status` and `runs` in a narrow terminal: URLs, paths and names whole, never folded
mid-word at 80 or 100 columns."""
from __future__ import annotations

import pytest
from rich.console import Console

from producer.status_view import provenance_table, server_tables

URLS = ["http://gpu-node-017.cluster.internal:30000", "http://gpu-node-017.cluster.internal:30001"]
MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"


def worker(name: str, models: list[str]) -> dict:
    return {"worker": name, "seen_s_ago": 3.2,
            "servers": [{"url": url, "state": "healthy", "in_flight": 200, "target": 256, "model_path": model,
                         "refusal": None, "last_error": None} for url, model in zip(URLS, models)]}


@pytest.mark.parametrize("width", [80, 100])
def test_the_servers_each_worker_sees_keep_their_urls_and_model_whole(width):
    # Given two workers on nodes with long host names, one serving one model, one two
    workers = [worker("gen@gpu-node-017.cluster.internal", [MODEL, MODEL]),
               worker("gen2@gpu-node-018", [MODEL, "Qwen/Qwen3-8B"])]
    console = Console(record=True, width=width)

    # When status prints them in a terminal this wide
    for table in server_tables(workers):
        console.print(table)
    text = console.export_text()

    # Then each URL, worker name and model is on one line, whole
    lines = text.splitlines()
    for whole in [*URLS, MODEL, "Qwen/Qwen3-8B", "gen@gpu-node-017.cluster.internal"]:
        assert any(whole in line for line in lines), (whole, text)
    assert all(len(line) <= width for line in lines) and "…" not in text, text


@pytest.mark.parametrize("width", [80, 100])
def test_what_made_the_samples_keeps_each_server_and_model_whole(width):
    # Given samples made by two servers on nodes with long host names, of a model with a long path
    model = "/models/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    origins = [{"server": url, "sglang_version": "0.5.23", "model_path": model, "weight_version": "default"}
               for url in URLS]
    console = Console(record=True, width=width)

    # When status prints what made them in a terminal this wide
    console.print(provenance_table(origins))
    text = console.export_text()

    # Then each URL and the model are whole, each on one line, and no line is wider than the terminal
    lines = text.splitlines()
    for whole in [*URLS, model, "0.5.23", "default"]:
        assert any(whole in line for line in lines), (whole, text)
    assert all(len(line) <= width for line in lines) and "…" not in text, text


@pytest.mark.parametrize("width", ["80", "100"])
def test_runs_keeps_each_shard_path_and_model_whole(client, server, width):
    from typer.testing import CliRunner

    from contract.run.spec import RunSpec, save_spec
    from contract.storage.shard_home import record
    from producer.cli import app

    # Given a run whose shards are under a long path, made by a model with a long name
    path = "/shared/traces/team-reasoning/deepseek-r1-distill/2026-december"
    save_spec(client, RunSpec(name="long-run", tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="t",
                              sampling={"max_new_tokens": 8}, thinking="prompt", think_start_id=1, think_end_id=2,
                              stop_ids=[3]))
    record(client, "long-run", path)

    # When `runs` prints in a terminal this wide
    result = CliRunner().invoke(app, ["runs"], env={"COLUMNS": width, "REDIS_URL": server})

    # Then the path is whole on one line, and no line is wider than the terminal
    assert result.exit_code == 0, result.output
    assert any(path in line for line in result.output.splitlines()), result.output
    assert all(len(line) <= int(width) for line in result.output.splitlines()), result.output
