"""The producer's faults stay local: bad run names, bad lines, re-exports and secrets.

Each test runs `python -m producer ...` as a subprocess against a real
redis-server, with stand-ins and a Celery worker where prompts must be generated.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import redis

from conftest import Fleet, messages_of, render, varied_prompts, write_prompts
from contract.ledger.ledger import Ledger
from producer.local import free_port, redis_server_binary, spawn, wait_for

BAD_RUN_NAMES = ["../../x", "/abs/path", "a:b", ""]


def test_a_bad_run_name_is_refused_by_every_command_and_nothing_is_written(fleet, tmp_path):
    # Given a prompt file, an empty Redis and no OUTPUT_DIR yet
    prompts = write_prompts(tmp_path / "p.jsonl", varied_prompts(3))
    dest = tmp_path / "export"
    commands = [["enqueue", str(prompts)], ["status"], ["status", "--json"], ["dead", "list", "--json"],
                ["dead", "show", "p-0000"], ["dead", "stats"], ["dead", "requeue", "--yes"],
                ["dead", "purge", "--yes"], ["export", str(dest)]]
    files_before = sorted(p for p in tmp_path.rglob("*") if "logs" not in p.parts)

    for name in BAD_RUN_NAMES:
        # When each command names a bad run by flag (and one through FLEET_RUN, where an
        # empty value means unset)
        results = [fleet.producer(*command, "--run", name, check=False) for command in commands]
        if name:
            results.append(fleet.producer("status", check=False, FLEET_RUN=name))

        # Then each exits 2 with a message that says which names are allowed
        for result in results:
            assert result.returncode == 2, (name, result.args, result.stdout, result.stderr)
            assert f"run name {name!r} is not allowed" in result.stderr, result.stderr
            assert "Traceback" not in result.stderr

    # and nothing was written: not in Redis, not under or beside OUTPUT_DIR, no export
    assert redis.Redis.from_url(fleet.redis_url).dbsize() == 0
    assert not fleet.output_dir.exists() and not dest.exists()
    assert not (fleet.output_dir / "../../x").resolve().exists()
    assert sorted(p for p in tmp_path.rglob("*") if "logs" not in p.parts) == files_before


# --- any bytes on a line ---------------------------------------------------------------------------

REFUSED = "TEMPLATE-REFUSES-THIS"
MAX_LINE = 8192
# (a bad line, a part of the reason enqueue must give for it)
BAD_LINES = [
    (b'{"id": "bad-utf8", "prompt": "caf\xe9"}', "invalid UTF-8"),
    (b'{"prompt": "lone \\ud800 surrogate"}', "lone surrogate (\\ud800)"),
    (b'{"id": "\\udc00", "prompt": "surrogate id"}', "id holds a lone surrogate"),
    (b'{"id": "nul", "prompt": "a\\u0000b"}', "NUL character"),
    (b'{"id": "long", "prompt": "' + b"x" * (2 * MAX_LINE) + b'"}', f"longer than --max-line-bytes ({MAX_LINE:,} bytes)"),
    (b"[" * 3_000 + b"]" * 3_000, "nested too deeply"),
    (b'{"id": "huge", "n": ' + b"9" * 5000 + b', "prompt": "x"}', "invalid JSON"),
    (b'{"id": "image", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
     "only text parts are accepted"),
    (b'{"id": "num", "messages": [{"role": "user", "content": 42}]}', "content is not a string but a number"),
    (b'{"id": "bool", "prompt": true}', "prompt is not a string but a boolean"),
    (b'{"id": "null", "messages": [{"role": "user", "content": null}]}', "content is not a string but null"),
    (b'{"id": "role", "messages": [{"role": 7, "content": "hi"}]}', "'role' is not a string but a number"),
    (b'{"id": 2.5, "prompt": "float id"}', "id must be a non-empty string or integer"),
    (b'["not", "an", "object"]', "not a JSON object"),
    (b"{broken json", "invalid JSON"),
    (b'{"id": "refused", "prompt": "' + REFUSED.encode() + b'"}', "chat template or tokenizer failed"),
]
TEXT_PARTS = {"id": "parts", "messages": [{"role": "user", "content": [
    {"type": "text", "text": "Say hello"}, {"type": "text", "text": "in French."}]}]}


def refusing_tokenizer(folder: Path) -> Path:
    """The bundled tokenizer, with a template that refuses any conversation holding REFUSED."""
    from contract.chat.bundled import bundled_tokenizer_dir

    shutil.copytree(bundled_tokenizer_dir(), folder)
    template = folder / "chat_template.jinja"
    guard = ("{%- for message in messages -%}{%- if '" + REFUSED + "' in message['content'] -%}"
             "{{- raise_exception('this template refuses the marker') -}}{%- endif -%}{%- endfor -%}\n")
    template.write_text(guard + template.read_text())
    return folder


def test_every_bad_line_is_reported_by_number_and_every_good_prompt_is_generated(fleet, tmp_path):
    # Given 20 good prompts (one of them OpenAI text parts) mixed with every kind of bad line,
    # the lone surrogate early in the first batch, and a template that refuses one good-looking prompt
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    good = varied_prompts(19) + [TEXT_PARTS]
    lines: list[tuple[bytes, str | None]] = [(json.dumps(r, ensure_ascii=False).encode(), None) for r in good]
    for index, bad in enumerate(BAD_LINES):
        lines.insert(2 + 2 * index, bad)  # after two good lines, then every other line
    bad_at = {number: reason for number, (_, reason) in enumerate(lines, start=1) if reason}
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line, _ in lines))
    tokenizer_dir = refusing_tokenizer(tmp_path / "tokenizer")

    # When the file is enqueued
    result = fleet.producer("enqueue", str(path), "--tokenizer", str(tokenizer_dir),
                            "--max-line-bytes", str(MAX_LINE), check=False)

    # Then enqueue exits 1, without a traceback, naming every bad line with its number and reason
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    reported = {int(m[1]): m[2] for m in re.finditer(r"^line (\d+): (.*)$", result.stderr, re.M)}
    assert set(reported) == set(bad_at), (sorted(reported), sorted(bad_at))
    for number, reason in bad_at.items():
        assert reason in reported[number], (number, reason, reported[number])
    assert "(id refused)" in reported[next(n for n, r in bad_at.items() if "template" in r)]

    # and all 20 good prompts are generated once each, with exactly the ids their template gives
    assert fleet.wait_finished() == {"done": 20}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows = {r["id"]: r for r in fleet.rows()}
    assert sorted(rows) == sorted(r["id"] for r in good)
    for record in good:
        messages = messages_of(record) if record is not TEXT_PARTS else [
            {"role": "user", "content": "Say hello in French."}]
        row = rows[record["id"]]
        assert row["input_ids"][:row["prompt_len"]] == render(tokenizer, messages), record["id"]
    stats = httpx.get(f"{url}/standin/stats").json()
    assert stats["generations"] == {r["id"]: 1 for r in good}


# --- export twice, each id once ---------------------------------------------------------------------

def _ledger_states(fleet: Fleet, ids: list[str], run: str = "default") -> dict[str, str | None]:
    ledger = Ledger(redis.Redis.from_url(fleet.redis_url), run)
    return dict(zip(ids, ledger.states(ids)))


def _read_export(dest: Path) -> tuple[list[str], dict]:
    """What a reader of DEST/*.parquet sees, and the manifest."""
    files = sorted(str(p) for p in dest.glob("*.parquet"))
    ids = pads.dataset(files, format="parquet").to_table(columns=["id"]).column("id").to_pylist()
    return ids, json.loads((dest / "manifest.json").read_text())


def test_exporting_again_into_the_same_folder_leaves_each_done_id_once(fleet, tmp_path):
    # Given a run of 20 prompts, some dead-lettered, exported into many small files
    _, url = fleet.standin("--fault-missing-think-end", "0.3")
    fleet.worker("w1", [url])
    records = varied_prompts(30)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records[:20])))
    fleet.wait_finished()
    dest = tmp_path / "dataset"
    fleet.producer("export", str(dest), "--rows-per-file", "3")
    first_ids, first = _read_export(dest)
    assert sorted(first_ids) == sorted(i for i, s in _ledger_states(fleet, [r["id"] for r in records]).items() if s == "done")
    assert first["rows"] == len(first_ids) == len(set(first_ids))

    # When 10 more prompts are enqueued and the dead letters requeued, all finish,
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))
    fleet.producer("dead", "requeue", "--yes")
    fleet.wait_finished()
    # a shard is stored twice (a worker died between its shard and its acknowledgement),
    run_dir = fleet.output_dir / "default"
    shards = sorted(run_dir.glob("*.parquet"))
    shutil.copy(shards[0], run_dir / "zz-redelivered-copy.parquet")
    # and a shard holds a sample of a prompt the ledger says is dead (its sample was written,
    # then a redelivery failed before it was marked done: the ledger never lets a done
    # prompt be dead-lettered, so the orphan row is the only trace)
    buried = next(i for i, s in _ledger_states(fleet, [r["id"] for r in records]).items() if s == "dead")
    orphan = pq.read_table(shards[0]).slice(0, 1)
    orphan = orphan.set_column(orphan.schema.get_field_index("id"), "id", pa.array([buried]))
    pq.write_table(orphan, run_dir / "zz-orphan.parquet")
    # and the run is exported again into the same folder, in one file
    result = fleet.producer("export", str(dest))

    # Then a reader of DEST/*.parquet sees each done id exactly once, and no dead one
    ids, manifest = _read_export(dest)
    states = _ledger_states(fleet, [r["id"] for r in records])
    assert len(ids) == len(set(ids))
    assert set(ids) == {i for i, s in states.items() if s == "done"} and buried not in ids
    assert len(ids) > len(first_ids)
    # and the manifest says what the folder holds, and what was left out and why
    stored = Counter(r["id"] for r in fleet.rows())
    assert manifest["rows"] == len(ids) == sum(f["rows"] for f in manifest["files"])
    assert sorted(f["name"] for f in manifest["files"]) == sorted(p.name for p in dest.glob("*.parquet"))
    for f in manifest["files"]:
        assert f["sha256"] == hashlib.sha256((dest / f["name"]).read_bytes()).hexdigest()
    assert manifest["left_out"] == {"dead": stored[buried]}
    assert manifest["duplicates_dropped"] == sum(n - 1 for i, n in stored.items() if i != buried)
    assert manifest["source_rows"] == sum(stored.values())
    assert f"{manifest['rows']} samples" in result.stdout
    # and nothing of the swap is left beside DEST
    assert sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(".dataset")) == []


def test_export_refuses_a_folder_that_is_not_an_export_and_leaves_it_alone(fleet, tmp_path):
    # Given a finished run, and a folder holding someone's own file
    _, url = fleet.standin()
    fleet.worker("w1", [url])
    fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(3))))
    fleet.wait_finished()
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")

    # When the run is exported into it
    result = fleet.producer("export", str(dest), check=False)

    # Then export refuses it with the reason, and the folder is untouched
    assert result.returncode == 2 and "not a previous export" in result.stderr
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


# --- secrets stay secret ------------------------------------------------------------------------------

PASSWORD = "pw-Zq8-redis-s3cret"
WRONG_PASSWORD = "pw-Wr0ng-guess-s3cret"
API_KEY = "sk-K3y-api-s3cret"
URL_TOKEN = "tok-B4sic-url-s3cret"
SECRETS = (PASSWORD, WRONG_PASSWORD, API_KEY, URL_TOKEN)


@pytest.fixture
def secure_fleet(tmp_path: Path):
    """A fleet whose Redis wants a password, passed only in REDIS_URL."""
    port = free_port()
    server = spawn(f"redis-auth-{port}", [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                                          "--save", "", "--requirepass", PASSWORD], tmp_path / "logs")
    fleet = Fleet(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    fleet.processes.append(server)
    wait_for(lambda: redis.Redis.from_url(fleet.redis_url).ping(), 20, "redis with a password", server)
    yield fleet
    fleet.stop()


def _redis_dump(url: str) -> str:
    """Every key and value in Redis, as text."""
    client = redis.Redis.from_url(url)
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        value = {"string": lambda: client.get(key), "hash": lambda: client.hgetall(key),
                 "list": lambda: client.lrange(key, 0, -1), "set": lambda: client.smembers(key),
                 "zset": lambda: client.zrange(key, 0, -1, withscores=True)}[kind]()
        parts.append(f"{key!r} {value!r}")
    return "\n".join(parts)


def test_passwords_api_keys_and_url_credentials_appear_nowhere(secure_fleet, tmp_path):
    fleet = secure_fleet
    # Given a server that wants an API key, a server whose URL carries credentials, both with
    # faults and a short context, and a worker bound to both that serves metrics
    options = ("--fault-missing-think-end", "0.3", "--context-length", "1500", "--output-len-max", "200")
    _, keyed = fleet.standin("--api-key", API_KEY, *options)
    _, plain = fleet.standin(*options)
    with_credentials = plain.replace("http://", f"http://fleetuser:{URL_TOKEN}@")
    shown = plain.replace("http://", "http://fleetuser:***@")
    metrics_port = free_port()
    fleet.worker("w1", [keyed, with_credentials], SGLANG_API_KEY=API_KEY, FLEET_METRICS_PORT=str(metrics_port))

    # When a run goes through, with a prompt too long for the servers, and is inspected and exported
    records = varied_prompts(16) + [{"id": "too-long", "prompt": "word " * 2000}]
    outputs = [fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", records)))]
    states = fleet.wait_finished()
    assert states.get("done", 0) >= 1 and states.get("dead", 0) >= 1
    dead = fleet.dead_letters()
    dest = tmp_path / "dataset"
    for command in (["status"], ["status", "--json"], ["dead", "list"], ["dead", "list", "--json"],
                    ["dead", "stats"], ["dead", "show", dead[0]["id"]], ["export", str(dest)]):
        outputs.append(fleet.producer(*command))
    status = json.loads(outputs[2].stdout)
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    # and the producer is pointed at a wrong host, or the right one with a wrong password
    closed = free_port()
    redis_port = fleet.redis_url.rsplit(":", 1)[1].split("/")[0]
    failures = [fleet.producer(*command, "--redis-url", url, check=False) for url, command in [
        (f"redis://:{PASSWORD}@127.0.0.1:{closed}/0", ["status"]),
        (f"redis://fleet:{PASSWORD}@127.0.0.1:{closed}/0", ["dead", "list"]),
        (f"redis://{PASSWORD}@127.0.0.1:{closed}/0", ["export", str(tmp_path / "never")]),
        (f"redis://127.0.0.1:{closed}/0?password={PASSWORD}", ["status", "--json"]),
        (f"redis://:{WRONG_PASSWORD}@127.0.0.1:{redis_port}/0", ["status"]),
    ]]
    failures.append(fleet.producer("enqueue", str(tmp_path / "p.jsonl"), check=False,
                                   REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{closed}/0"))

    # Then the failures are said plainly, with the URL redacted
    for failure in failures:
        assert failure.returncode == 2 and "cannot use Redis at redis://" in failure.stderr, failure.stderr
        assert "Traceback" not in failure.stderr
    # and no secret appears in any output, log, status, metric, shard, dead letter, export or Redis key
    texts = {f"output {i}": r.stdout + r.stderr for i, r in enumerate(outputs + failures)}
    texts |= {f"log {p.name}": p.read_text(errors="replace") for p in fleet.logs.glob("*.log")}
    texts["metrics"] = metrics
    texts["shards"] = repr(fleet.rows())
    texts["export"] = repr(pads.dataset(sorted(str(p) for p in dest.glob("*.parquet"))).to_table().to_pylist())
    texts["manifest"] = (dest / "manifest.json").read_text()
    texts["redis"] = _redis_dump(fleet.redis_url)  # dead letters, heartbeats, queued messages
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {where}"

    # and the server with credentials did work, recorded by its redacted URL everywhere
    assert shown in {r["server"] for r in fleet.rows()} | {s for d in dead for s in d["servers"]}
    assert {s["url"] for s in status["workers"][0]["servers"]} == {keyed, shown}
    assert f'fleet_server_up{{server="{shown}"}} 1.0' in metrics
    too_long = next(d for d in dead if d["id"] == "too-long")
    assert too_long["reason"] == "prompt_too_long"
    assert shown in too_long["message"] or keyed in too_long["message"]
    # and the metrics page answers on loopback only
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.2:{metrics_port}/metrics")
