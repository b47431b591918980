"""The stand-in cannot drift from the real server: the same requests to SGLang 0.5.23 (its CPU engine,
tests/real_sglang.py) and to `python -m sglang_standin` started with the same settings, and every
status, body shape, limit and message that the fleet reads compared.

What the fleet reads, and so what is compared: the info routes of the preflight
(workers/servers/preflight.py: model_path, served_model_name, context length, max_req_input_len,
allow_auto_truncate, dp_size; capacity.py: effective_max_running_requests_per_dp,
max_running_requests), the load routes (load.py, capacity.py: /v1/loads and whether /get_load
exists), a generation's keys and types (answers.py, cache_hits.py) and the error bodies
(sglang_client.py error_message: the text under error, error.message or message).

The two servers see the same tokenizer (the checkpoint's folder) and the same limits: a context of
4,096 declared by the model, not given on the command line; a KV cache of 16,384 tokens; a batch
limit of 8, given. Log-probabilities (`enqueue --logprobs K`) are compared by their keys, lengths
and entries' types, and by the ids they name (the values are the model's). The random checkpoint stops only at its budget, so the stand-in is asked to
ignore its EOS where output lengths are compared. The second to last test sends an id outside the
vocabulary, which ends both servers; the last starts both again with --enable-metrics.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from contract.run.logprobs import from_meta
from producer.local import Process, start_standin
from conftest import shared_servers
from real_sglang import CONTEXT, RealServer
from waiting import wait_until

pytestmark = pytest.mark.xdist_group("real-sglang")  # with the shared servers (conftest.shared_servers)

BATCH, KV_TOKENS = 8, 16384
#: As tests/real_sglang.py starts the real server: a context from the model, 16,384 KV tokens.
STANDIN_LIMITS = ("--model-context-length", str(CONTEXT), "--max-total-tokens", str(KV_TOKENS),
                  "--max-running-requests", str(BATCH))
STEPS = ("--step-base", "0.01")  # 10 ms a decode step: a long request is in flight a while, as on the CPU


@dataclass
class Pair:
    """The real server and the stand-in, asked the same questions."""
    real: RealServer
    standin: Process
    standin_url: str

    def ask(self, method: str, path: str, **request: Any) -> tuple[httpx.Response, httpx.Response]:
        """The same request to both: (the real server's answer, the stand-in's)."""
        return (httpx.request(method, self.real.url + path, timeout=300, **request),
                httpx.request(method, self.standin_url + path, timeout=300, **request))

    def stop(self) -> None:
        """The stand-in stopped; the real server is left to the tests that share it (conftest.shared_servers)."""
        self.standin.stop()


def start_pair(logs: Path, model: Path, *options: str) -> Pair:
    """The real server (shared: a load is ~19 CPU-seconds) and the stand-in on `model`, with the same limits
    and `options`."""
    real = shared_servers().get(model, "--max-running-requests", str(BATCH), *options)
    standin, url = start_standin(logs, None, "--model-path", str(model), *STANDIN_LIMITS, *STEPS, *options)
    return Pair(real, standin, url)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, sglang_models) -> Iterator[Pair]:
    started = start_pair(tmp_path_factory.mktemp("contract-logs"), sglang_models["random"])
    yield started
    started.stop()


def shape(value: Any) -> Any:
    """A JSON value's keys and types, its values left out (a list by its first entry)."""
    if isinstance(value, dict):
        return {key: shape(entry) for key, entry in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def prompt(n: int) -> list[int]:
    return [100 + i for i in range(n)]


def generate(input_ids: list[int] | str, **sampling: Any) -> dict:
    key = "text" if isinstance(input_ids, str) else "input_ids"
    return {"json": {key: input_ids, "sampling_params": sampling}}


def both(answers: tuple[httpx.Response, httpx.Response]) -> str:
    real, standin = answers
    return f"\nreal:     {real.status_code} {real.text[:600]}\nstand-in: {standin.status_code} {standin.text[:600]}"


# ------------------------------------------------------------------------------------------- info routes
def test_health_and_the_info_routes_report_the_same_limits(pair: Pair):
    # Given both servers, with the context from the model and the batch limit given
    # When the routes a worker's preflight and health check read are asked
    health = pair.ask("GET", "/health")
    model_info = pair.ask("GET", "/model_info")
    server_info = pair.ask("GET", "/server_info")
    models = pair.ask("GET", "/v1/models")

    # Then health is 200 with an empty body on both
    assert [(r.status_code, r.content) for r in health] == [(200, b"")] * 2
    # And the model is named alike
    real, standin = (r.json() for r in model_info)
    for key in ("model_path", "served_model_name", "reasoning_parser", "is_generation", "weight_version"):
        assert real[key] == standin[key], key
    # And /server_info has the same limits: no context length (not given), the given batch limit,
    # the scheduler's longest input (context - 6), the KV size, and the effective batch per rank
    real, standin = (r.json() for r in server_info)
    for key in ("model_path", "served_model_name", "context_length", "max_running_requests",
                "max_req_input_len", "max_total_num_tokens", "allow_auto_truncate", "dp_size",
                "reasoning_parser", "version", "weight_version"):
        assert real.get(key, "absent") == standin.get(key, "absent"), key
    assert real["context_length"] is None and real["max_req_input_len"] == CONTEXT - 6
    effective = [[s["effective_max_running_requests_per_dp"] for s in info["internal_states"]]
                 for info in (real, standin)]
    assert effective[0] == effective[1], effective
    assert "vocab_size" not in real and "vocab_size" not in standin
    # And the context length is /v1/models' max_model_len on both
    real, standin = (r.json() for r in models)
    assert real["data"][0]["max_model_len"] == standin["data"][0]["max_model_len"] == CONTEXT
    assert real["data"][0]["id"] == standin["data"][0]["id"]


def test_load_is_read_from_v1_loads_alike_and_neither_serves_get_load_or_metrics(pair: Pair):
    # Given both servers, idle, started without --enable-metrics
    # When the load routes and /metrics are asked
    loads = pair.ask("GET", "/v1/loads")
    core = pair.ask("GET", "/v1/loads?include=core")
    missing = [pair.ask("GET", path) for path in ("/get_load", "/metrics")]

    # Then /v1/loads has the same keys and types at every level, and the same capacity
    assert [r.status_code for r in loads] == [200, 200]
    real, standin = (r.json() for r in loads)
    assert shape(real) == shape(standin), both(loads)
    for key in ("max_running_requests", "max_total_num_tokens", "num_running_reqs", "num_waiting_reqs"):
        assert real["loads"][0][key] == standin["loads"][0][key], key
    assert shape(core[0].json()) == shape(core[1].json()), both(core)
    # And /get_load and /metrics are 404 on both
    for answers in missing:
        assert [r.status_code for r in answers] == [404, 404], both(answers)


# ------------------------------------------------------------------------------------------- /generate
def test_a_generation_has_the_same_keys_types_and_echoed_rid(pair: Pair):
    # Given a prompt, asked twice under a rid (the second finds it in the prefix cache), then with
    # a budget of 0, then as text
    ids = prompt(24)
    first = pair.ask("POST", "/generate", json={"input_ids": ids, "rid": "contract-1",
                                                "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    again = pair.ask("POST", "/generate", json={"input_ids": ids, "rid": "contract-2",
                                                "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    empty = pair.ask("POST", "/generate", **generate(prompt(5), max_new_tokens=0))
    text = pair.ask("POST", "/generate", **generate("hello world", max_new_tokens=2, ignore_eos=True))

    # Then every answer is 200 with the same top-level and meta_info keys on both
    for answers in (first, again, empty, text):
        assert [r.status_code for r in answers] == [200, 200], both(answers)
        real, standin = (r.json() for r in answers)
        assert list(real) == list(standin) == ["text", "output_ids", "meta_info"]
        assert set(real["meta_info"]) == set(standin["meta_info"]), both(answers)
        read = ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency")
        assert {k: shape(real["meta_info"][k]) for k in read} == {k: shape(standin["meta_info"][k]) for k in read}
        # and the weights that made it (the run's provenance, the shards' weight_version column), alike
        assert real["meta_info"]["weight_version"] == standin["meta_info"]["weight_version"] == "default"
    # And the rid comes back as meta_info.id, the budget as a length finish, alike
    for answer in first:
        meta = answer.json()["meta_info"]
        assert meta["id"] == "contract-1"
        assert meta["finish_reason"] == {"type": "length", "length": 4} and meta["completion_tokens"] == 4
    # And cached_tokens_details is null without a cache hit and {"device": n, "host": 0} with one
    assert [r.json()["meta_info"]["cached_tokens_details"] for r in first] == [None, None]
    details = [r.json()["meta_info"]["cached_tokens_details"] for r in again]
    assert [shape(d) for d in details] == [{"device": "int", "host": "int"}] * 2 and details[0]["host"] == 0
    # And a budget of 0 answers no tokens, and text is tokenized alike
    assert [r.json()["output_ids"] for r in empty] == [[], []]
    assert [r.json()["meta_info"]["finish_reason"] for r in empty] == [{"type": "length", "length": 0}] * 2
    assert text[0].json()["meta_info"]["prompt_tokens"] == text[1].json()["meta_info"]["prompt_tokens"] == 2


# Log-probability asks (top-level fields) and budgets: what `enqueue --logprobs K` sends, and its edges.
LOGPROB_ASKS = {
    "the top 3 of 4 tokens": ({"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": -1}, 4),
    "no top lists": ({"return_logprob": True}, 3),
    "a budget of 0": ({"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": -1}, 0),
    "top lists without return_logprob": ({"top_logprobs_num": 2}, 2),
    "a negative top_logprobs_num": ({"return_logprob": True, "top_logprobs_num": -1}, 2),
}
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length",
                "input_top_logprobs", "output_top_logprobs")


def test_log_probabilities_come_with_the_same_keys_lengths_and_entries_and_name_the_output_ids(pair: Pair):
    for case, (ask, budget) in LOGPROB_ASKS.items():
        # Given a log-probability ask; when both are asked for a generation with it
        body = {"input_ids": prompt(12), "sampling_params": {"max_new_tokens": budget, "ignore_eos": True}, **ask}
        answers = pair.ask("POST", "/generate", json=body)
        assert [r.status_code for r in answers] == [200, 200], (case, both(answers))
        real, standin = (r.json() for r in answers)
        # Then meta_info has the same keys on both, the same lists as long, their entries
        # [float, int, null] alike
        assert set(real["meta_info"]) == set(standin["meta_info"]), (case, both(answers))
        for key in LOGPROB_KEYS:
            if key in real["meta_info"]:
                r, s = real["meta_info"][key], standin["meta_info"][key]
                assert shape(r) == shape(s), (case, key, r, s)
                assert (len(r) if isinstance(r, list) else r) == (len(s) if isinstance(s, list) else s), (case, key)
        # And each output token's entry names the output id at its position, on both, so the
        # fleet reads both alike (contract/run/logprobs.py)
        k = ask.get("top_logprobs_num", 0) if ask.get("return_logprob") else 0
        for answer in (real, standin):
            meta = answer["meta_info"]
            if ask.get("return_logprob"):
                assert [e[1] for e in meta["output_token_logprobs"]] == answer["output_ids"], case
                assert meta["output_token_logprobs_length"] == len(answer["output_ids"]) == budget
            if k > 0:
                scores = from_meta(dict(meta), answer["output_ids"], k)
                assert len(scores.top_ids) == k * budget and len(scores.chosen) == budget, case
                assert all(len(position) == k for position in meta["output_top_logprobs"]), case


def test_the_sampling_a_line_may_set_is_taken_alike(pair: Pair):
    # Given every sampling key a line may set, as the worker sends them (the seed as sampling_seed)
    line = {"temperature": 0, "top_p": 0.5, "top_k": 1, "min_p": 0.1, "max_new_tokens": 3, "sampling_seed": 1234,
            "skip_special_tokens": False, "ignore_eos": True}
    # When both are asked with them; then both answer 3 tokens
    answers = pair.ask("POST", "/generate", **generate(prompt(9), **line))
    assert [r.status_code for r in answers] == [200, 200], both(answers)
    assert [len(r.json()["output_ids"]) for r in answers] == [3, 3]


REFUSED = {
    "an unknown sampling key": generate(prompt(5), max_new_tokens=4, max_tokens=4),
    "a float budget": generate(prompt(5), max_new_tokens=3.0),
    "a string temperature": generate(prompt(5), temperature="hot"),
    "a negative budget": generate(prompt(5), max_new_tokens=-1),
    "top_p 0": generate(prompt(5), top_p=0),
    "top_k 0": generate(prompt(5), top_k=0),
    "a string return_logprob": {"json": {"input_ids": prompt(5), "sampling_params": {"max_new_tokens": 2},
                                         "return_logprob": "yes"}},
    "a whole float top_logprobs_num": {"json": {"input_ids": prompt(5), "sampling_params": {"max_new_tokens": 2},
                                                "return_logprob": True, "top_logprobs_num": 2.0}},
    "empty input_ids": generate([], max_new_tokens=4),
    "no input at all": {"json": {"sampling_params": {"max_new_tokens": 4}}},
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_request_gets_the_same_status_and_body(pair: Pair, case: str):
    # Given a request that SGLang refuses; when it is sent to both
    answers = pair.ask("POST", "/generate", **REFUSED[case])
    # Then both answer 400 with the same body, word for word (the fleet keeps the message)
    assert [r.status_code for r in answers] == [400, 400], both(answers)
    assert answers[0].json() == answers[1].json(), both(answers)


SCHEMA_ERRORS = {
    "input_ids of the wrong type": {"json": {"input_ids": "x", "sampling_params": {}}},
    "a fractional top_logprobs_num": {"json": {"input_ids": [100, 101], "return_logprob": True,
                                               "top_logprobs_num": 2.5}},
    "no JSON content type": {"content": b'{"input_ids": [100, 101], "sampling_params": {}}'},
    "a text/plain content type": {"content": b'{"input_ids": [100, 101]}', "headers": {"content-type": "text/plain"}},
}


@pytest.mark.parametrize("case", list(SCHEMA_ERRORS))
def test_a_body_that_fails_the_schema_gets_the_same_error_shape(pair: Pair, case: str):
    # Given a body FastAPI cannot read as SGLang's request; when it is sent to both
    answers = pair.ask("POST", "/generate", **SCHEMA_ERRORS[case])
    # Then both answer 400 {"object": "error", "message": ..., "code": 400} (the message is pydantic's)
    assert [r.status_code for r in answers] == [400, 400], both(answers)
    real, standin = (r.json() for r in answers)
    assert shape(real) == shape(standin), both(answers)
    assert (real["object"], real["code"]) == (standin["object"], standin["code"]) == ("error", 400)


# Prompt length and budget (None: none given, SGLang's default 128) at each edge of a 4,096 context.
EDGES = [
    (CONTEXT - 7, 1),     # the longest prompt the scheduler takes
    (CONTEXT - 6, 0),     # max_req_input_len itself: refused by the scheduler
    (CONTEXT - 1, 1),     # a total of exactly the context passes the tokenizer's check, not the scheduler's
    (CONTEXT - 1, 2),     # a total above the context
    (CONTEXT, None),      # a prompt of the whole context
    (CONTEXT - 16, 16),   # a total of exactly the context: accepted, the answer capped at context - 2 - prompt
    (CONTEXT - 16, 15),
    (CONTEXT - 16, None),  # no budget given: no total check, the same cap
]


@pytest.mark.parametrize("length,budget", EDGES)
def test_the_context_limits_are_the_same_at_every_edge(pair: Pair, length: int, budget: int | None):
    # Given a prompt and a budget at an edge of the context
    sampling = {"ignore_eos": True} if budget is None else {"max_new_tokens": budget, "ignore_eos": True}
    # When sent to both
    answers = pair.ask("POST", "/generate", **generate(prompt(length), **sampling))
    # Then both take it or both refuse it, with the same message; taken, with as many tokens
    assert answers[0].status_code == answers[1].status_code, both(answers)
    real, standin = (r.json() for r in answers)
    if answers[0].status_code == 200:
        assert len(real["output_ids"]) == len(standin["output_ids"]), both(answers)
        assert real["meta_info"]["finish_reason"] == standin["meta_info"]["finish_reason"]
    else:
        assert real == standin, both(answers)


def _running(url: str) -> int:
    return httpx.get(f"{url}/v1/loads", timeout=30).json()["loads"][0]["num_running_reqs"]


def test_a_rid_still_in_flight_is_refused_alike(pair: Pair):
    # Given a long generation under rid "busy" running on each server
    long = {"input_ids": prompt(24), "rid": "busy", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with ThreadPoolExecutor(2) as threads:
        running = []
        for url in (pair.real.url, pair.standin_url):
            running.append(threads.submit(httpx.post, f"{url}/generate", json=long, timeout=300))
            wait_until(lambda: _running(url) == 1, 60, f"the long request running on {url}")
        # When a request with the same rid is sent to both
        answers = pair.ask("POST", "/generate", json={**long, "sampling_params": {"max_new_tokens": 2}})
        for url in (pair.real.url, pair.standin_url):
            httpx.post(f"{url}/abort_request", json={"rid": "busy"}, timeout=30)
        ended = [future.result().json()["meta_info"]["finish_reason"]["type"] for future in running]
    # Then both refuse it, 400 with the same message (the fleet retries it: its earlier try still runs)
    assert [r.status_code for r in answers] == [400, 400], both(answers)
    assert answers[0].json() == answers[1].json() == {"error": {"message": "Duplicate request ID detected: busy"}}
    # And the long ones end aborted alike
    assert ended == ["abort", "abort"]


def test_tokenize_answers_with_the_servers_own_tokenizer_alike(pair: Pair):
    # Given the checkpoint's tokenizer on both; when a prompt and a list of prompts are tokenized
    one = pair.ask("POST", "/tokenize", json={"prompt": "hello world"})
    many = pair.ask("POST", "/tokenize", json={"prompt": ["hello world", "Détails ✓ <think>"]})
    plain = pair.ask("POST", "/tokenize", content=b'{"prompt": "hello"}', headers={"content-type": "text/plain"})
    # Then both answer the same tokens, counts and max_model_len
    for answers in (one, many):
        assert [r.status_code for r in answers] == [200, 200], both(answers)
        assert answers[0].json() == answers[1].json(), both(answers)
    # And both want a JSON content type
    assert [r.status_code for r in plain] == [400, 400], both(plain)
    assert shape(plain[0].json()) == shape(plain[1].json()), both(plain)


# ------------------------------------------------------------------------------------------- the end
def test_a_new_weight_version_is_reported_alike_by_the_info_routes_and_every_answer(pair: Pair):
    # Given both servers at the default weight version (this test comes late, before the one that ends
    # them: its generation would change what the load and cache tests read of a fresh server)
    try:
        # When an RL loop names new weights (without aborting what runs), and a request lacks the version
        updated = pair.ask("POST", "/update_weight_version", json={"new_version": "rl-7", "abort_all_requests": False})
        missing = pair.ask("POST", "/update_weight_version", json={})

        # Then both accept it with the same body, and refuse the request without a version alike
        assert [r.status_code for r in updated] == [200, 200], both(updated)
        assert updated[0].json() == updated[1].json() == {"success": True, "message": "Weight version updated to rl-7",
                                                          "new_version": "rl-7"}
        assert missing[0].status_code == missing[1].status_code, both(missing)
        # And /model_info and each answer's meta_info report it from then on, alike, while /server_info
        # keeps the launch value (0.5.23 updates the tokenizer manager's copy, not the server args)
        assert [r.json()["weight_version"] for r in pair.ask("GET", "/model_info")] == ["rl-7", "rl-7"]
        assert [r.json()["weight_version"] for r in pair.ask("GET", "/server_info")] == ["default", "default"]
        # (ids no other test's prompt starts with: nothing of it in the prefix cache they read)
        answers = pair.ask("POST", "/generate", **generate([700 + i for i in range(6)], max_new_tokens=2,
                                                           ignore_eos=True))
        assert [r.json()["meta_info"]["weight_version"] for r in answers] == ["rl-7", "rl-7"]
    finally:  # the other tests of the pair see the default again
        pair.ask("POST", "/update_weight_version", json={"new_version": "default", "abort_all_requests": False})


def test_an_id_outside_the_vocabulary_ends_both_servers_without_an_answer(pair: Pair):
    # Given both servers (this test ends them: it runs last)
    vocabulary = 129280  # the bundled tokenizer's length, the checkpoint's vocab_size
    body = {"input_ids": [100, 101, vocabulary], "sampling_params": {"max_new_tokens": 2}}
    for url, process in ((pair.real.url, pair.real.process), (pair.standin_url, pair.standin)):
        # When a prompt holds the first id outside the vocabulary
        with pytest.raises(httpx.TransportError):
            answer = httpx.post(f"{url}/generate", json=body, timeout=120)
            print(f"{url} answered {answer.status_code} {answer.text[:300]}", file=sys.stderr)
        # Then the connection drops with no answer, and the server exits: its port refuses
        process.popen.wait(60)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)


def test_with_enable_metrics_both_serve_metrics_and_time_their_answers_alike(pair: Pair, tmp_path, sglang_models):
    # Given both servers started again with --enable-metrics (the ones above ended by the test before)
    pair.stop()
    metered = start_pair(tmp_path, sglang_models["random"], "--enable-metrics")
    try:
        # When a prompt is generated twice (the second finds it cached) and /metrics scraped
        metered.ask("POST", "/generate", **generate(prompt(12), max_new_tokens=3, ignore_eos=True))
        answers = metered.ask("POST", "/generate", **generate(prompt(12), max_new_tokens=3, ignore_eos=True))
        pages = metered.ask("GET", "/metrics")
    finally:
        metered.stop()
    # Then the answers have the same keys (the scheduler's timestamps come with the metrics), and types
    real, standin = (r.json()["meta_info"] for r in answers)
    assert set(real) == set(standin), both(answers)
    assert {k: shape(v) for k, v in real.items()} == {k: shape(v) for k, v in standin.items()}
    # And both pages are Prometheus text holding the series the project reads, labelled by model
    assert [r.status_code for r in pages] == [200, 200]
    for page in pages:
        assert page.headers["content-type"].startswith("text/plain")
        for name in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:num_running_reqs",
                     "sglang:num_queue_reqs"):
            assert any(line.startswith(name + "{") and "model_name=" in line for line in page.text.splitlines()), \
                (name, page.url)
