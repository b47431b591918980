"""Specs for the SGLang stand-in, checked over real HTTP against a real process.

Each spec reads given / when / then. The stand-in runs as a subprocess
(`python -m sglang_standin`) on a free port; expected tokens come from its
pure `outputs` module, which is what other tests use too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from sglang_standin.bad_outputs import HUGE_ID, bad_output_kind
from sglang_standin.cli import parse_config
from sglang_standin.config import BAD_OUTPUT_KINDS, StandinConfig
from sglang_standin.outputs import fault_for, generate_output, natural_output, prompt_key

from waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0"]
CONTEXT = 4096
#: The shared server's output-relevant options, as a config and as CLI flags.
CFG = StandinConfig(context_length=CONTEXT, seed=7, fault_queue_full_first=0.25)
SHARED_ARGS = [*INSTANT, "--health-latency", "0", "--context-length", str(CONTEXT),
               "--seed", "7", "--fault-queue-full-first", "0.25"]
QUEUE_FULL_BODY = {"object": "error", "message": "The request queue is full.", "type": "503",
                   "param": None, "code": 503}


# --------------------------------------------------------------------------- helpers
class Standin:
    """A running stand-in process and an HTTP client for it."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=20, trust_env=False)

    def generate(self, body: dict, **kw: object) -> httpx.Response:
        return self.http.post("/generate", json=body, **kw)

    def stats(self) -> dict:
        return self.http.get("/standin/stats").json()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def standin(*args: str, wait: bool = True) -> Iterator[Standin]:
    """Start `python -m sglang_standin` on a free port; kill it afterwards."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_standin", "--port", str(port), *args],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Standin(proc, port)
    try:
        if wait:
            wait_until(lambda: _listening(port) or proc.poll() is not None, 20, "the stand-in to listen", poll=0.05)
            assert proc.poll() is None, "stand-in exited during start-up"
        yield server
    finally:
        server.http.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        log.close()


def prompt_with(fault: str | None, cfg: StandinConfig = CFG, length: int = 12) -> list[int]:
    """A prompt (ending with think-start) that the stand-in gives `fault`."""
    for k in range(10_000):
        ids = [1000 + k + i for i in range(length - 1)] + [cfg.think_start_id]
        if fault_for(ids, cfg) == fault:
            return ids
    raise AssertionError(f"no prompt with fault {fault}")


@pytest.fixture(scope="module")
def server() -> Iterator[Standin]:
    with standin(*SHARED_ARGS) as s:
        yield s


# --------------------------------------------------------------------------- health
def test_health_is_refused_while_loading_then_503_while_warming_then_200_empty() -> None:
    # given a stand-in that loads for 1 s and warms up for 1 s
    with standin("--load-seconds", "1", "--warmup-seconds", "1", "--health-latency", "0.2",
                 wait=False) as s:
        # when it has just started, then the port is closed (connection refused)
        with pytest.raises(httpx.ConnectError):
            s.http.get("/health")
        # when the port opens, then health is 503 with an empty body
        first = _poll(s, lambda r: r is not None)
        assert first.status_code == 503 and first.content == b""
        # when warm-up is over, then health is 200 with an empty body, after the latency
        ready = _poll(s, lambda r: r is not None and r.status_code == 200)
        assert ready.content == b""
        assert ready.elapsed.total_seconds() >= 0.18
        assert s.http.get("/health_generate").status_code == 200
        assert s.http.get("/ping").status_code == 200


def _poll(s: Standin, done, timeout: float = 15.0) -> httpx.Response:  # type: ignore[no-untyped-def]
    """/health until `done(response)` (a refused connection is None); returns that response."""
    answers: list[httpx.Response | None] = []

    def answered() -> bool:
        try:
            answers.append(s.http.get("/health"))
        except httpx.ConnectError:
            answers.append(None)
        return done(answers[-1])

    wait_until(answered, timeout, "the awaited /health answer", poll=0.05)
    return answers[-1]  # type: ignore[return-value]


def _tokens_in_use(s: Standin) -> int:
    """Prompt plus generated tokens of the running requests, as /v1/loads reports them."""
    return s.http.get("/v1/loads").json()["loads"][0]["num_used_tokens"]


def _running_and_waiting(s: Standin) -> tuple[int, int]:
    stats = s.stats()
    return stats["running"], stats["waiting"]


# --------------------------------------------------------------------------- /generate
def test_generate_answers_in_sglang_shape(server: Standin) -> None:
    # given a prompt without fault whose natural answer fits the budget
    prompt = prompt_with(None)
    # when it is generated with a rid
    r = server.generate({"input_ids": prompt, "rid": "shape-1",
                         "sampling_params": {"max_new_tokens": 3000, "temperature": 0.6, "top_p": 0.95}})
    # then the body has SGLang's keys, eos included and counted, one think-end
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    out, meta = body["output_ids"], body["meta_info"]
    assert out[-1] == CFG.eos_id and out.count(CFG.think_end_id) == 1
    assert CFG.think_start_id not in out
    assert meta["finish_reason"] == {"type": "stop", "matched": CFG.eos_id}
    assert meta["completion_tokens"] == len(out)
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["id"] == "shape-1"
    assert {"weight_version", "num_retractions", "reasoning_tokens", "cached_tokens",
            "cached_tokens_details", "dp_rank", "e2e_latency", "response_sent_to_client_ts"} <= set(meta)


@pytest.mark.parametrize("max_new_tokens", [None, 7, 50, 3000])
def test_output_is_exactly_what_outputs_module_predicts(server: Standin, max_new_tokens: int | None) -> None:
    # given prompts of different lengths and a budget (None: SGLang's default 128)
    for length in (3, 20, 200):
        prompt = prompt_with(None, length=length)
        params = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        # when generated
        body = server.generate({"input_ids": prompt, "sampling_params": params}).json()
        # then tokens and finish reason are exactly generate_output's
        expected = generate_output(prompt, 128 if max_new_tokens is None else max_new_tokens, CFG)
        assert (body["output_ids"], body["meta_info"]["finish_reason"]) == expected


def test_small_budget_finishes_with_length(server: Standin) -> None:
    # given a prompt whose natural answer is longer than 5 tokens
    prompt = prompt_with(None)
    assert len(natural_output(prompt, CFG)) > 5
    # when max_new_tokens is 5
    body = server.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}}).json()
    # then five tokens come back, no eos, finish reason length
    assert len(body["output_ids"]) == 5 and CFG.eos_id not in body["output_ids"]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_unknown_sampling_key_is_400_with_the_contract_gates_string(server: Standin) -> None:
    # given the OpenAI name max_tokens instead of max_new_tokens
    r = server.generate({"input_ids": [5, 6, 7], "sampling_params": {"max_tokens": 5}})
    # then SGLang 0.5.23's contract gate refuses it: 400, serde's text as a plain string
    assert r.status_code == 400
    assert r.json()["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`")


def test_an_id_outside_the_vocabulary_ends_the_server_unless_told_to_reject_it() -> None:
    # given a stand-in as SGLang 0.5.23 (the default), and one started with --oov-ids reject
    for ids in ([5, 6, 129280], [5, -1, 7]):
        with standin(*INSTANT, "--health-latency", "0") as s:
            # when a prompt holds an id outside [0, vocabulary), then no answer comes and the server exits
            with pytest.raises(httpx.TransportError):
                s.generate({"input_ids": ids})
            assert s.proc.wait(timeout=10) != 0
    with standin(*INSTANT, "--health-latency", "0", "--oov-ids", "reject") as s:
        # then the other answers 400 and keeps serving
        r = s.generate({"input_ids": [5, 6, 129280]})
        assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]
        assert s.generate({"input_ids": [5, 6, 7]}).status_code == 200


def test_a_rid_in_flight_is_refused_until_its_client_leaves_and_the_server_aborts_it() -> None:
    # given a stand-in whose generations all take a minute, and a client that gives up on one after 0.5 s
    with standin(*INSTANT, "--health-latency", "0", "--fault-slow", "1", "--slow-seconds", "60") as s:
        body = {"input_ids": [5, 6, 7], "rid": "gone"}
        with pytest.raises(httpx.ReadTimeout):
            s.generate(body, timeout=0.5)
        # when the same rid is sent again at once, then it is refused as SGLang refuses it
        again = s.generate(body)
        assert again.status_code == 400
        assert again.json() == {"error": {"message": "Duplicate request ID detected: gone"}}
        # and within SGLang's 4 s look for a client gone, the generation is aborted and the rid free
        wait_until(lambda: _running_and_waiting(s) == (0, 0), 10, "the abandoned generation aborted", poll=0.1)
        with pytest.raises(httpx.ReadTimeout):  # taken, and running
            s.generate(body, timeout=0.5)


def test_without_a_tokenizer_text_and_tokenize_are_refused_with_a_reason(server: Standin) -> None:
    # given the stand-in's default model path, a hub id and no folder: no tokenizer
    # when text is sent, or /tokenize asked, then 400 saying so
    text = server.generate({"text": "hello", "sampling_params": {"max_new_tokens": 2}})
    assert text.status_code == 400 and "no tokenizer" in text.json()["error"]["message"]
    tokenize = server.http.post("/tokenize", json={"prompt": "hello"})
    assert tokenize.status_code == 400 and "no tokenizer" in tokenize.json()["message"]
    # and a body sent without a JSON content type is a schema error, as SGLang's FastAPI answers
    raw = server.http.post("/generate", content=json.dumps({"input_ids": [5, 6]}).encode())
    assert raw.status_code == 400 and raw.json()["object"] == "error"


def test_with_a_tokenizer_folder_text_is_tokenized_and_tokenize_answers() -> None:
    # given a stand-in whose tokenizer path is the bundled tokenizer's folder
    from contract.chat.bundled import bundled_tokenizer_dir

    with standin(*INSTANT, "--health-latency", "0", "--tokenizer-path", str(bundled_tokenizer_dir())) as s:
        # when text is generated from and /tokenize asked
        tokens = s.http.post("/tokenize", json={"prompt": "hello world"}).json()
        body = s.generate({"text": "hello world", "sampling_params": {"max_new_tokens": 3}}).json()
        # then the ids are the tokenizer's, and the prompt is counted in them
        assert tokens == {"tokens": [33310, 2058], "count": 2, "max_model_len": 131072}
        assert body["meta_info"]["prompt_tokens"] == 2 and len(body["output_ids"]) == 3


def test_prompt_longer_than_context_is_400_with_sglang_message(server: Standin) -> None:
    # given a prompt as long as the context
    r = server.generate({"input_ids": [7] * CONTEXT})
    # then 400 with SGLang's message
    assert r.status_code == 400
    assert r.json() == {"error": {"message": f"The input ({CONTEXT} tokens) is longer than "
                                             f"the model's context length ({CONTEXT} tokens)."}}


def test_request_errors_use_sglang_bodies(server: Standin) -> None:
    # given empty, text-only and malformed requests, then each gets its SGLang shape
    assert server.generate({"input_ids": []}).json() == {"error": {"message": "input_ids cannot be empty."}}
    assert server.generate({}).json() == {
        "error": {"message": "Either text, input_ids or input_embeds should be provided."}}
    assert server.generate({"text": "hi"}).status_code == 400
    bad = server.generate({"input_ids": "abc"})
    assert bad.status_code == 400 and bad.json()["type"] == "Bad Request"
    assert server.generate({"input_ids": [1], "sampling_params": {"top_p": 0}}).status_code == 400


def test_queue_full_first_fault_answers_503_once_then_200(server: Standin) -> None:
    # given a prompt the stand-in answers "queue full" on its first request
    prompt = prompt_with("queue_full_first")
    request = {"input_ids": prompt, "rid": "qf-1", "sampling_params": {"max_new_tokens": 3000}}
    # when sent twice
    first, second = server.generate(request), server.generate(request)
    # then 503 with SGLang's body, then the normal answer
    assert first.status_code == 503 and first.json() == QUEUE_FULL_BODY
    assert second.status_code == 200
    assert second.json()["output_ids"] == generate_output(prompt, 3000, CFG)[0]
    stats = server.stats()
    assert stats["attempts"]["qf-1"] == 2 and stats["generations"]["qf-1"] == 1


def test_batch_answers_a_list_in_order_with_suffixed_rids(server: Standin) -> None:
    # given two prompts in one request with a string rid
    prompts = [prompt_with(None, length=5), prompt_with(None, length=9)]
    body = server.generate({"input_ids": prompts, "rid": "batch",
                            "sampling_params": {"max_new_tokens": 40}}).json()
    # then a list, in order, rids rid_0 and rid_1
    assert [b["meta_info"]["id"] for b in body] == ["batch_0", "batch_1"]
    assert [b["output_ids"] for b in body] == [generate_output(p, 40, CFG)[0] for p in prompts]


def test_stream_sends_cumulative_chunks_then_done(server: Standin) -> None:
    # given a streamed request
    prompt = prompt_with(None)
    r = server.generate({"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 30}})
    # then SSE data lines, the last one [DONE], the final chunk the full answer
    assert r.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in r.text.split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: "):])
    assert (final["output_ids"], final["meta_info"]["finish_reason"]) == generate_output(prompt, 30, CFG)


def test_v1_models_reports_the_context_length(server: Standin) -> None:
    body = server.http.get("/v1/models").json()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "deepseek-ai/DeepSeek-R1"
    assert body["data"][0]["max_model_len"] == CONTEXT
    info = server.http.get("/model_info").json()
    assert info["model_path"] == "deepseek-ai/DeepSeek-R1" and info["is_generation"] is True


def test_stats_count_requests_attempts_generations_and_tokens(server: Standin) -> None:
    # given the counters before
    before = server.stats()
    prompt = prompt_with(None)
    # when one prompt is generated twice under one rid
    outs = [server.generate({"input_ids": prompt, "rid": "stats-1",
                             "sampling_params": {"max_new_tokens": 20}}).json() for _ in range(2)]
    # then both show up
    after = server.stats()
    assert after["requests"] - before["requests"] == 2
    assert after["attempts"]["stats-1"] == 2 and after["generations"]["stats-1"] == 2
    assert after["tokens_generated"] - before["tokens_generated"] == sum(len(o["output_ids"]) for o in outs)
    assert after["running"] == 0 and after["waiting"] == 0


# --------------------------------------------------------------------------- time model
def test_requests_beyond_max_running_wait_and_beyond_max_queued_get_503() -> None:
    # given 2 running slots, 1 queue slot and 10 ms per decode step
    args = ["--max-running-requests", "2", "--max-queued-requests", "1", "--step-base", "0.01",
            "--step-per-request", "0", "--prefill-per-token", "0", "--health-latency", "0"]
    cfg = StandinConfig()
    prompts = [p for p in (prompt_with(None, cfg, 6 + i) for i in range(40))
               if len(natural_output(p, cfg)) > 60][:4]
    with standin(*args) as s:
        async def scenario() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=s.url, timeout=20, trust_env=False) as client:
                def send(p: list[int]):  # type: ignore[no-untyped-def]
                    return client.post("/generate", json={"input_ids": p, "sampling_params": {"max_new_tokens": 60}})
                first3 = [asyncio.create_task(send(p)) for p in prompts[:3]]
                await asyncio.to_thread(wait_until, lambda: _running_and_waiting(s) == (2, 1), 20,
                                        "2 running and 1 waiting", poll=0.02)
                # when a fourth arrives while 2 run and 1 waits
                fourth = await send(prompts[3])
                stats = (await client.get("/standin/stats")).json()
                assert (stats["running"], stats["waiting"]) == (2, 1)
                return [*await asyncio.gather(*first3), fourth]

        started = time.monotonic()
        *done, fourth = asyncio.run(scenario())
        # then the fourth is rejected, the third finished a batch later
        assert fourth.status_code == 503 and fourth.json() == QUEUE_FULL_BODY
        assert [r.status_code for r in done] == [200, 200, 200]
        assert time.monotonic() - started >= 1.1  # 60 steps x 10 ms, twice


def test_abort_request_ends_a_running_generation_with_abort() -> None:
    # given a slow stand-in (50 ms per step) and a long generation with rid "ab"
    with standin("--step-base", "0.05", "--health-latency", "0") as s:
        result: list[httpx.Response] = []
        prompt = prompt_with(None, StandinConfig())
        t = threading.Thread(target=lambda: result.append(
            s.generate({"input_ids": prompt, "rid": "ab", "sampling_params": {"max_new_tokens": 400}})))
        t.start()
        wait_until(lambda: _tokens_in_use(s) > len(prompt), 20, "the first tokens generated", poll=0.02)
        # when it is aborted
        assert s.http.post("/abort_request", json={"rid": "ab"}).status_code == 200
        t.join(10)
        # then it answers 200 with an abort finish reason and a partial output
        body = result[0].json()
        assert result[0].status_code == 200
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        full = generate_output(prompt, 400, StandinConfig())[0]
        assert 0 < len(body["output_ids"]) < len(full)
        assert body["output_ids"] == full[: len(body["output_ids"])]


def test_sigterm_finishes_running_requests_answers_503_then_exits_0() -> None:
    # given a stand-in where every generation takes 1.5 s extra (slow fault)
    with standin(*INSTANT, "--fault-slow", "1", "--slow-seconds", "1.5", "--health-latency", "0") as s:
        result: list[httpx.Response] = []
        t = threading.Thread(target=lambda: result.append(s.generate({"input_ids": [5, 6, 7]})))
        t.start()
        wait_until(lambda: s.stats()["running"] > 0, 20, "the generation running", poll=0.05)
        # when SIGTERM arrives mid-generation
        s.proc.send_signal(signal.SIGTERM)
        # then health turns 503, the request still completes, and the process exits 0
        wait_until(lambda: s.http.get("/health").status_code == 503, 20, "/health to answer 503", poll=0.05)
        t.join(10)
        assert result[0].status_code == 200
        assert s.proc.wait(timeout=10) == 0


def test_api_key_guards_everything_but_health() -> None:
    with standin(*INSTANT, "--api-key", "sekret", "--health-latency", "0") as s:
        r = s.generate({"input_ids": [1, 2]})
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert s.http.get("/health").status_code == 200
        ok = s.generate({"input_ids": [1, 2]}, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        info = s.http.get("/server_info", headers={"Authorization": "Bearer sekret"}).json()
        assert info["api_key"] is None


# --------------------------------------------------------------------------- bad outputs
BAD_ARGS = [*INSTANT, "--health-latency", "0", "--fault-bad-output", "1", "--huge-body-ids", "500000"]
BAD_CFG = StandinConfig(fault_bad_output=1.0, huge_body_ids=500_000)


def _prompts_by_kind(cfg: StandinConfig) -> dict[str, list[int]]:
    """One prompt per bad-output kind, found with the stand-in's own pure rule."""
    found: dict[str, list[int]] = {}
    for k in range(10_000):
        ids = [2000 + k + i for i in range(11)] + [cfg.think_start_id]
        found.setdefault(bad_output_kind(ids, cfg), ids)  # type: ignore[arg-type]
        if set(found) >= set(cfg.enabled_bad_output_kinds):
            return found
    raise AssertionError(f"kinds never drawn: {set(cfg.enabled_bad_output_kinds) - set(found)}")


def test_each_bad_output_kind_is_a_200_a_strict_client_must_refuse() -> None:
    # given a stand-in that gives every prompt a bad output, and one prompt per kind
    prompts = _prompts_by_kind(BAD_CFG)
    with standin(*BAD_ARGS) as s:
        for kind, prompt in prompts.items():
            # when the prompt is generated
            r = s.generate({"input_ids": prompt, "rid": f"bad-{kind}"})
            # then the answer is 200 application/json, wrong in exactly the predicted way
            assert r.status_code == 200 and r.headers["content-type"] == "application/json", kind
            expected, finish = generate_output(prompt, 128, BAD_CFG)
            if kind == "not_json":
                with pytest.raises(ValueError):
                    json.loads(r.content)
                continue
            body = r.json()
            ids, meta = body["output_ids"], body["meta_info"]
            if kind == "meta_types":
                assert ids == expected
                assert meta["completion_tokens"] == str(len(expected))
                assert meta["finish_reason"] == [finish]
                continue
            assert meta["completion_tokens"] == len(ids)
            if kind == "huge_body":
                assert len(ids) == 500_000 and len(r.content) > 1_500_000
                continue
            pos = len(expected) // 2
            bad = {"negative": -1, "null": None, "bool": True, "float": 1.5,
                   "string": str(expected[pos]), "huge_id": HUGE_ID,
                   "beyond_vocab": BAD_CFG.vocab_size}[kind]
            assert ids[:pos] + ids[pos + 1:] == expected[:pos] + expected[pos + 1:], kind
            assert ids[pos] == bad and type(ids[pos]) is type(bad), kind
        # and the stats say which rid got which kind
        assert s.stats()["bad_outputs"] == {f"bad-{k}": [k] for k in prompts}
    assert BAD_CFG.vocab_size == 129280  # DeepSeek-V3/R1's vocabulary: ids 0..129279


def test_bad_output_hits_exactly_the_predicted_prompts_with_the_enabled_kinds() -> None:
    # given a third of prompts hit, only null and negative enabled (listed in any order)
    cfg = StandinConfig(fault_bad_output=0.34, bad_output_kinds="null,negative", seed=3)
    prompts = [[3000 + k + i for i in range(9)] for k in range(24)]
    predicted = {f"p{k}": bad_output_kind(p, cfg) for k, p in enumerate(prompts)}
    assert set(predicted.values()) == {None, "null", "negative"}
    with standin(*INSTANT, "--health-latency", "0", "--seed", "3", "--fault-bad-output", "0.34",
                 "--bad-output-kinds", "null,negative") as s:
        # when every prompt is generated once (plus one without rid: keyed by sha256)
        for k, p in enumerate(prompts):
            body = s.generate({"input_ids": p, "rid": f"p{k}"}).json()
            # then unhit prompts are untouched and hit ones carry their kind's entry
            kind = predicted[f"p{k}"]
            if kind is None:
                assert body["output_ids"] == generate_output(p, 128, cfg)[0]
            else:
                assert ({"null": None, "negative": -1}[kind]) in body["output_ids"]
        hit = next(p for p in prompts if bad_output_kind(p, cfg))
        s.generate({"input_ids": hit})
        # and the stats record exactly the predicted hits, under the same keys as attempts
        stats = s.stats()
        expected = {key: [kind] for key, kind in predicted.items() if kind}
        expected[prompt_key(hit)] = [bad_output_kind(hit, cfg)]  # type: ignore[list-item]
        assert stats["bad_outputs"] == expected
        assert set(stats["bad_outputs"]) <= set(stats["attempts"])


def test_bad_output_kinds_option_rejects_unknown_kinds() -> None:
    assert parse_config(["--bad-output-kinds", "huge_id, null"]).bad_output_kinds == ("huge_id", "null")
    assert parse_config([]).bad_output_kinds == BAD_OUTPUT_KINDS
    with pytest.raises(SystemExit):
        parse_config(["--bad-output-kinds", "negative,bogus"])


# --------------------------------------------------------------------------- trickle
def test_trickle_sends_the_body_slowly_so_a_per_read_timeout_never_fires() -> None:
    # given a stand-in that trickles every answer over 2 s
    cfg = StandinConfig(fault_trickle=1.0)
    prompt = prompt_with("trickle", cfg)
    with standin(*INSTANT, "--health-latency", "0", "--fault-trickle", "1",
                 "--trickle-seconds", "2") as s:
        # when a client whose only timeout is 0.5 s per read asks for it
        timeout = httpx.Timeout(connect=5, read=0.5, write=5, pool=5)
        arrivals: list[float] = []
        content = b""
        with httpx.Client(base_url=s.url, timeout=timeout, trust_env=False) as client:
            started = time.monotonic()
            with client.stream("POST", "/generate", json={"input_ids": prompt, "rid": "slow-1"}) as r:
                assert r.status_code == 200 and r.headers["content-type"] == "application/json"
                for piece in r.iter_raw():
                    arrivals.append(time.monotonic() - started)
                    content += piece
        # then it never times out, the bytes arrive spread over ~2 s, and the body is right
        assert arrivals[0] < 0.5 and arrivals[-1] >= 1.8, (arrivals[0], arrivals[-1])
        assert len(arrivals) >= 10
        assert len(content) == int(r.headers["content-length"])
        assert json.loads(content)["output_ids"] == generate_output(prompt, 128, cfg)[0]
        assert s.stats()["trickled"] == {"slow-1": 1}


def test_a_wedged_engine_keeps_the_port_answering_but_never_finishes_health_or_generate() -> None:
    # given a stand-in started wedged, trickling /health a byte every 0.2 s
    with standin(*INSTANT, "--health-latency", "0", "--wedge", "--wedge-trickle-seconds", "0.2") as s:
        timeout = httpx.Timeout(connect=5, read=1.0, write=5, pool=5)
        with httpx.Client(base_url=s.url, timeout=timeout, trust_env=False) as client:
            # when /health is read for a while, then its head is 200 and bytes keep coming, within any
            # per-read timeout, with no end
            with client.stream("GET", "/health") as r:
                assert r.status_code == 200
                pieces = r.iter_raw()
                assert [next(pieces) for _ in range(5)] == [b"\n"] * 5
            # and /generate and the scheduler's routes never answer, while the info routes still do
            for method, path in (("POST", "/generate"), ("GET", "/server_info"), ("GET", "/v1/loads")):
                with pytest.raises(httpx.ReadTimeout):
                    client.request(method, path, json={"input_ids": [5, 6, 7], "rid": "held-1"})
            assert client.get("/model_info").status_code == 200
            # when it heals, then health and generation answer again, and the held request was noted
            assert client.post("/standin/wedge", json={"wedged": False}).json() == {"wedged": False}
            assert client.get("/health").status_code == 200
            assert client.post("/generate", json={"input_ids": [5, 6, 7], "rid": "after"}).status_code == 200
        assert s.stats()["wedged"] == {"held-1": 1}
        assert "held-1" not in s.stats()["generations"]  # its client left before the engine came back


# --------------------------------------------------------------------------- load reporting
#: A `/v1/loads` entry's keys, as SGLang 0.5.23 answers (tests/real/test_standin_contract.py).
LOAD_KEYS = {"timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
             "num_used_tokens", "num_total_tokens", "num_active_tokens", "num_prealloc_ready_tokens",
             "max_total_num_tokens", "max_running_requests", "token_usage", "gen_throughput",
             "cache_hit_rate", "utilization", "total_prefill_uncached_tokens", "total_prefill_busy_us",
             "decode_moments", "memory", "disaggregation", "queues"}


def _busy(s: Standin, prompts: list[list[int]]) -> tuple[list[httpx.Response], dict, httpx.Response]:
    """Three generations on a 2-slot server; /v1/loads and /get_load read while 2 run and 1 waits."""
    async def scenario() -> tuple[list[httpx.Response], dict, httpx.Response]:
        async with httpx.AsyncClient(base_url=s.url, timeout=20, trust_env=False) as client:
            tasks = [asyncio.create_task(client.post("/generate", json={
                "input_ids": p, "sampling_params": {"max_new_tokens": 80}})) for p in prompts]
            await asyncio.to_thread(wait_until, lambda: _running_and_waiting(s) == (2, 1), 20,
                                    "2 running and 1 waiting", poll=0.02)
            loads = (await client.get("/v1/loads")).json()
            legacy = await client.get("/get_load")
            return list(await asyncio.gather(*tasks)), loads, legacy

    return asyncio.run(scenario())


def _long_prompts(cfg: StandinConfig) -> list[list[int]]:
    return [p for p in (prompt_with(None, cfg, 6 + i) for i in range(40)) if len(natural_output(p, cfg)) > 80][:3]


BUSY = ["--max-running-requests", "2", "--max-queued-requests", "5", "--step-base", "0.01",
        "--step-per-request", "0", "--prefill-per-token", "0", "--health-latency", "0"]


def test_loads_report_live_running_and_waiting_like_sglang() -> None:
    # given 2 running slots, a queue of 5, 10 ms per step, and three long generations
    prompts = _long_prompts(StandinConfig())
    with standin(*BUSY) as s:
        info = s.http.get("/server_info").json()
        # then server_info reports the limits and one internal state
        assert (info["max_running_requests"], info["max_queued_requests"]) == (2, 5)
        assert [st["effective_max_running_requests_per_dp"] for st in info["internal_states"]] == [2]
        assert s.http.get("/get_server_info").json()["internal_states"] == info["internal_states"]
        # when the load is asked while 2 run and 1 waits
        answers, loads, legacy = _busy(s, prompts)
        # then /v1/loads has SGLang 0.5.23's shape and the live counts
        assert set(loads) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
        assert set(loads["loads"][0]) == LOAD_KEYS
        load = loads["loads"][0]
        assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 1)
        assert load["max_running_requests"] == 2 and load["queues"]["waiting"] == 1
        # (the running prompts' tokens and what they generated so far: none yet if asked before
        # the first step, at most their budgets)
        running_prompts = sum(len(p) for p in prompts[:2])
        assert running_prompts <= load["num_used_tokens"] <= running_prompts + 2 * 80
        # and /get_load is 404, and no answer carries the load, as in 0.5.23
        assert legacy.status_code == 404
        assert all("num_running_reqs" not in r.json()["meta_info"] for r in answers)
        # and once idle, everything is zero; sections can be narrowed; a bad section is a bare 500
        idle = s.http.get("/v1/loads", params={"include": "core"}).json()["loads"][0]
        assert (idle["num_running_reqs"], idle["num_waiting_reqs"]) == (0, 0)
        assert "memory" not in idle and "queues" not in idle
        assert s.http.get("/v1/loads", params={"dp_rank": 1}).json()["loads"] == []
        bad = s.http.get("/v1/loads", params={"include": "bogus"})
        assert bad.status_code == 500 and bad.text == "Internal Server Error"


def test_other_releases_load_reports_are_there_only_when_asked_for() -> None:
    # given the same busy server, started with --serve-get-load (older releases) and
    # --meta-info-load (2026 main builds): neither is SGLang 0.5.23's behaviour
    prompts = _long_prompts(StandinConfig())
    with standin(*BUSY, "--serve-get-load", "--meta-info-load") as s:
        # when the load is asked while 2 run and 1 waits
        answers, _, legacy = _busy(s, prompts)
        # then /get_load is the legacy list
        body = legacy.json()
        assert [set(x) for x in body] == [{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens",
                                           "num_pending_tokens", "ts_tic"}]
        assert (body[0]["num_reqs"], body[0]["num_waiting_reqs"]) == (3, 1)
        # (the waiting prompt's tokens not yet prefilled: how many depends on when it was asked)
        assert 0 <= body[0]["num_pending_tokens"] <= len(prompts[2])
        # and each answer's meta_info carries the load next to num_retractions
        for r in answers:
            meta = r.json()["meta_info"]
            assert isinstance(meta["num_running_reqs"], int) and isinstance(meta["num_waiting_reqs"], int)


# --------------------------------------------------------------------------- api key
def test_api_key_is_required_everywhere_but_health_and_metrics() -> None:
    # given a stand-in started with an API key
    with standin(*INSTANT, "--api-key", "sekret", "--health-latency", "0", "--enable-metrics") as s:
        guarded = ["/ping", "/server_info", "/get_server_info", "/model_info", "/get_model_info",
                   "/v1/models", "/v1/loads", "/flush_cache", "/standin/stats"]
        for path in guarded:
            # when called without or with a wrong key, then 401 {"error": "Unauthorized"}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = s.http.get(path, headers=headers)
                assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, (path, headers)
            # and with the key (scheme in any case), then it answers
            assert s.http.get(path, headers={"Authorization": "bearer sekret"}).status_code == 200, path
        assert s.http.post("/abort_request", json={"abort_all": True}).status_code == 401
        # then /health* stays open for probes, as in SGLang
        assert s.http.get("/health").status_code == 200
        assert s.http.get("/health_generate").status_code == 200
        assert s.http.get("/metrics").status_code == 200  # open, as in SGLang


def test_an_api_key_rotated_in_place_is_required_from_the_next_request_and_health_never_changes() -> None:
    # given a stand-in started with key 1
    with standin(*INSTANT, "--api-key", "key-1", "--health-latency", "0") as s:
        old, new = {"Authorization": "Bearer key-1"}, {"Authorization": "Bearer key-2"}
        # then rotating needs the key in force, and a body naming the new one
        assert s.http.post("/standin/api-key", json={"api_key": "key-2"}, headers=new).status_code == 401
        assert s.http.post("/standin/api-key", json={"key": "key-2"}, headers=old).status_code == 400
        # when it is rotated to key 2
        r = s.http.post("/standin/api-key", json={"api_key": "key-2"}, headers=old)
        assert r.status_code == 200 and "key-2" not in r.text
        # then key 1 is refused and key 2 accepted from the next request on, on every guarded route
        assert s.generate({"input_ids": [1, 2]}, headers=old).status_code == 401
        assert s.generate({"input_ids": [1, 2]}, headers=new).status_code == 200
        assert s.http.get("/server_info", headers=old).status_code == 401
        assert s.http.get("/server_info", headers=new).json()["api_key"] is None
        # and /health answered the same throughout: a probe cannot see the rotation
        assert s.http.get("/health").status_code == 200
    # and a stand-in started without a key has none to rotate
    with standin(*INSTANT, "--health-latency", "0") as s:
        assert s.http.post("/standin/api-key", json={"api_key": "k"}).status_code == 409


# --------------------------------------------------------------------------- prefix cache
def _scraped(s: Standin) -> dict[str, dict]:
    """/metrics parsed: series name -> (labels, value) of its one sample."""
    from prometheus_client.parser import text_string_to_metric_families

    r = s.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {sample.name: (sample.labels, sample.value)
            for family in text_string_to_metric_families(r.text) for sample in family.samples}


def test_prompts_sharing_a_prefix_report_cached_tokens_and_metrics_add_them_up() -> None:
    # given a stand-in with the default time model and prefix cache
    with standin("--health-latency", "0", "--served-model-name", "m1", "--enable-metrics") as s:
        system = list(range(2000, 2300))  # a 300-token shared system prompt
        first = s.generate({"input_ids": system + [11, 12],
                            "sampling_params": {"max_new_tokens": 6}}).json()
        # when a second prompt shares the system prompt, and a third continues the first's answer
        second = s.generate({"input_ids": system + [13],
                             "sampling_params": {"max_new_tokens": 6}}).json()
        turn = system + [11, 12] + first["output_ids"] + [14, 15]
        third = s.generate({"input_ids": turn, "sampling_params": {"max_new_tokens": 6}}).json()
        streamed = s.generate({"input_ids": system + [16], "stream": True,
                               "sampling_params": {"max_new_tokens": 6}})
        chunks = [json.loads(c[len("data: "):]) for c in streamed.text.split("\n\n")
                  if c and c != "data: [DONE]"]
        answers = [first, second, third, chunks[-1]]
        # then each answer says how much of its prompt the server had cached: nothing, the
        # system prompt, the first prompt with all its answer but the last token, and in a
        # stream the system prompt from the first chunk on
        assert [a["meta_info"]["cached_tokens"] for a in answers] == [
            0, 300, 302 + len(first["output_ids"]) - 1, 300]
        assert {c["meta_info"]["cached_tokens"] for c in chunks} == {300}
        # and the server's counters are the sums over its answers, labelled by model
        series = _scraped(s)
        labels = {"model_name": "m1"}
        assert series["sglang:prompt_tokens_total"] == (
            labels, float(sum(a["meta_info"]["prompt_tokens"] for a in answers)))
        assert series["sglang:cached_tokens_total"] == (
            labels, float(sum(a["meta_info"]["cached_tokens"] for a in answers)))
        assert series["sglang:num_running_reqs"] == (labels, 0.0)
        assert series["sglang:num_queue_reqs"] == (labels, 0.0)
        # and after /flush_cache on an idle server the same prompt finds nothing cached
        assert s.http.post("/flush_cache").status_code == 200
        again = s.generate({"input_ids": system + [13], "sampling_params": {"max_new_tokens": 6}})
        assert again.json()["meta_info"]["cached_tokens"] == 0


def test_disable_radix_cache_reports_no_cached_tokens() -> None:
    # given a stand-in started with SGLang's --disable-radix-cache
    with standin(*INSTANT, "--health-latency", "0", "--disable-radix-cache", "--enable-metrics") as s:
        # when the same prompt is sent twice
        answers = [s.generate({"input_ids": list(range(3000, 3100))}).json() for _ in range(2)]
        # then neither found anything cached, and the counter agrees
        assert [a["meta_info"]["cached_tokens"] for a in answers] == [0, 0]
        assert _scraped(s)["sglang:cached_tokens_total"][1] == 0.0
        assert _scraped(s)["sglang:prompt_tokens_total"][1] == 200.0
