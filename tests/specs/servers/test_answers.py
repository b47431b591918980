"""What a server's answer must be to count, one row per kind of bad answer; and the credentials refusal.

Given the bytes of a 200 answer to `/generate`, when `read_answer` reads them
with the request's budget and the model's vocabulary bound, then a good
answer gives its ids and meta_info unchanged, and every kind of bad answer
raises `BadOutput` with an excerpt that shows the offending values and their
positions and at most the body's first 500 bytes. Given a server whose info
routes answer 401/403, the preflight refuses it naming `SGLANG_API_KEY`, and a
401/403 on `/generate` is a `ServerRefused`, never a retry or a dead letter.
"""
from __future__ import annotations

import json

import pytest

from contract.names import ServerState
from workers.servers.answers import (BYTES_PER_TOKEN, EXCERPT_BYTES, INT32_LIMIT, SLACK_BYTES, BadOutput, answer_cap,
                             id_bound, read_answer)
from workers.servers.health import HealthMonitor
from workers.servers.server_info import Info, apply_info, credentials_refusal
from workers.servers.bindings import ServerBinding, ServerPool
from workers.settings import Settings
from workers.servers.sglang_client import InFlightThere, ServerRefused, ServerRejected, TransientError, failure

VOCAB = 129280
IDS = [11, 12, 128822, 21, 22, 1]
META = {"id": "p-1", "finish_reason": {"type": "stop", "matched": 1}, "prompt_tokens": 5,
        "completion_tokens": len(IDS), "cached_tokens": 0, "e2e_latency": 0.25}


def body(output_ids: object = IDS, meta: object = META, **extra) -> bytes:
    return json.dumps({"text": "…", "output_ids": output_ids, "meta_info": meta, **extra}).encode()


def with_id(position: int, value: object) -> list:
    ids = list(IDS)
    ids[position] = value
    return ids


def read(raw: bytes, complete: bool = True, max_new_tokens: int | None = 64, bound: int = VOCAB):
    return read_answer(raw, complete=complete, max_new_tokens=max_new_tokens, bound=bound)


def test_a_good_answer_is_read_unchanged():
    assert read(body()) == (IDS, META)
    assert read(b"[" + body() + b"]") == (IDS, META)  # SGLang's batch shape, one prompt
    assert read(body([]))[0] == []
    assert read(body(meta={**META, "finish_reason": None}))[1]["finish_reason"] is None  # verification's call
    assert read(body(meta={**META, "finish_reason": {"type": "stop", "matched": "</s>"}}))


ENTRY_KINDS = [
    # kind, the value put at position 3, and what the excerpt shows for it
    ("negative", -1, -1),
    ("null", None, None),
    ("bool", True, True),
    ("float", 1.5, 1.5),
    ("whole float", 21.0, 21.0),
    ("string", "21", "21"),
    ("huge_id", 2**31, 2**31),
    ("beyond_vocab", VOCAB, VOCAB),
    ("nested list", [21], "[21]"),
]


@pytest.mark.parametrize("kind,value,shown", ENTRY_KINDS, ids=[row[0] for row in ENTRY_KINDS])
def test_an_output_id_that_is_not_a_token_id_is_a_bad_output_with_its_position_and_value(kind, value, shown):
    with pytest.raises(BadOutput) as caught:
        read(body(with_id(3, value)))
    excerpt = caught.value.excerpt
    assert excerpt["bad_ids"] == [{"position": 3, "value": shown}]
    assert excerpt["bad_ids_count"] == 1 and excerpt["output_len"] == len(IDS)
    assert "output_ids[3]" in str(caught.value)


def test_without_a_vocabulary_size_only_the_int32_bound_applies():
    assert id_bound(None, None) == INT32_LIMIT
    assert id_bound(VOCAB, None) == id_bound(None, VOCAB) == VOCAB
    assert id_bound(163840, VOCAB) == VOCAB
    assert read(body(with_id(3, VOCAB)), bound=id_bound(None))[0][3] == VOCAB
    with pytest.raises(BadOutput):
        read(body(with_id(3, INT32_LIMIT)), bound=id_bound(None))


def test_many_bad_ids_are_counted_and_the_first_few_listed():
    with pytest.raises(BadOutput) as caught:
        read(body([-1] * 40))
    assert caught.value.excerpt["bad_ids_count"] == 40
    assert [b["position"] for b in caught.value.excerpt["bad_ids"]] == list(range(8))


META_KINDS = [
    # kind, meta_info, the fields the excerpt names
    ("meta_types", {**META, "completion_tokens": "6", "finish_reason": [META["finish_reason"]]},
     {"meta_info.completion_tokens", "meta_info.finish_reason"}),
    ("bool count", {**META, "prompt_tokens": True}, {"meta_info.prompt_tokens"}),
    ("string latency", {**META, "e2e_latency": "fast"}, {"meta_info.e2e_latency"}),
    ("infinite latency", {**META, "e2e_latency": float("inf")}, {"meta_info.e2e_latency"}),
    ("finish type", {**META, "finish_reason": {"type": 3}}, {"meta_info.finish_reason.type"}),
    ("matched bool", {**META, "finish_reason": {"type": "stop", "matched": True}},
     {"meta_info.finish_reason.matched"}),
    ("matched beyond int32", {**META, "finish_reason": {"type": "stop", "matched": 2**40}},
     {"meta_info.finish_reason.matched"}),
    ("meta_info a list", [META], {"meta_info"}),
    ("meta_info missing", None, {"meta_info"}),
]


@pytest.mark.parametrize("kind,meta,fields", META_KINDS, ids=[row[0] for row in META_KINDS])
def test_meta_info_of_the_wrong_types_is_a_bad_output_naming_the_fields(kind, meta, fields):
    with pytest.raises(BadOutput) as caught:
        read(body(meta=meta))
    assert set(caught.value.excerpt["meta_problems"]) == fields


SHAPE_KINDS = [
    # kind, the body, complete, a fragment of the message
    ("not_json", body()[: len(body()) // 2], True, "not JSON"),
    ("not utf-8", b'{"output_ids": [1], "meta_info": {}, "text": "\xff\xfe"}', True, "not JSON"),
    ("empty body", b"", True, "not JSON"),
    ("no output_ids", json.dumps({"text": "hi", "meta_info": META}).encode(), True, "output_ids"),
    ("output_ids an object", body({"0": 11}), True, "output_ids"),
    ("two answers", b"[" + body() + b"," + body() + b"]", True, "output_ids"),
    ("more ids than max_new_tokens", body(list(range(100, 165))), True, "65 output_ids for max_new_tokens=64"),
    ("huge_body, cut off at the cap", b'{"output_ids": [' + b"100," * 2000, False, "larger than"),
]


@pytest.mark.parametrize("kind,raw,complete,fragment", SHAPE_KINDS, ids=[row[0] for row in SHAPE_KINDS])
def test_a_body_of_the_wrong_shape_is_a_bad_output_with_its_first_bytes(kind, raw, complete, fragment):
    with pytest.raises(BadOutput) as caught:
        read(raw, complete=complete)
    assert fragment in str(caught.value)
    head = caught.value.excerpt["body_head"]
    assert len(head.encode()) <= EXCERPT_BYTES + 3 * 4 and raw[:20].decode("utf-8", "replace") in head


def test_no_excerpt_holds_the_whole_body():
    raw = body([-1] * 100_000)
    with pytest.raises(BadOutput) as caught:
        read(raw, max_new_tokens=None)
    assert len(json.dumps(caught.value.excerpt)) < 2_000 < len(raw)


def test_the_size_cap_follows_the_budget_unless_a_setting_overrides_it():
    assert answer_cap(64) == 64 * BYTES_PER_TOKEN + SLACK_BYTES
    assert answer_cap(64, override=10_000) == 10_000
    assert answer_cap(None) > answer_cap(32768) > 32768 * 130  # above DeepSeek's longest token, 130 JSON bytes


STATUSES = [(401, ServerRefused), (403, ServerRefused), (400, ServerRejected), (422, ServerRejected),
            (500, TransientError), (503, TransientError)]


@pytest.mark.parametrize("status,kind", STATUSES, ids=[str(s) for s, _ in STATUSES])
def test_each_error_status_means_one_thing(status, kind):
    assert type(failure("http://a", status, b'{"error": "Unauthorized"}')) is kind


def test_a_duplicate_request_id_is_an_earlier_request_still_in_flight_there():
    found = failure("http://a", 400, b'{"error": {"message": "Duplicate request ID p-1"}}')
    assert type(found) is InFlightThere and isinstance(found, TransientError)


OK_INFO = {
    "model_info": Info("/model_info", 200, {"model_path": "m", "is_generation": True}),
    "server_info": Info("/server_info", 200, {"allow_auto_truncate": False, "served_model_name": "m"}),
    "models": Info("/v1/models", 200, {"data": [{"max_model_len": 4096}]}),
}


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("key_sent", [True, False])
def test_a_server_that_refuses_the_workers_credentials_is_refused_naming_the_setting(status, key_sent):
    binding = ServerBinding("http://a")
    info = {**OK_INFO, "server_info": Info("/server_info", status, None)}
    apply_info(binding, info, key_sent)
    assert binding.refusal and "SGLANG_API_KEY" in binding.refusal and f"HTTP {status}" in binding.refusal
    assert ("is set" in binding.refusal) == key_sent and ("unset" in binding.refusal) != key_sent


def test_a_server_that_accepts_the_credentials_is_filled_and_not_refused():
    binding = ServerBinding("http://a", refusal="HTTP 401 on /model_info: ...")
    apply_info(binding, {**OK_INFO, "model_info": Info("/model_info", 200, {**OK_INFO["model_info"].body,
                                                                            "vocab_size": VOCAB})}, True)
    assert binding.refusal is None
    assert (binding.model_path, binding.max_model_len, binding.vocab_size) == ("m", 4096, VOCAB)


def test_a_401_on_generate_refuses_the_server_until_it_comes_back_and_passes_the_preflight():
    # Given a usable server (the preflight injected: it accepts the credentials)
    settings = Settings(sglang_urls="http://a", health_failures=3, health_successes=2)
    pool = ServerPool(["http://a"], 4)
    def preflight(_client, b) -> None:
        b.refusal, b.max_model_len = None, 4096

    monitor = HealthMonitor(pool, settings, {}, preflight=preflight)
    binding = pool.bindings[0]
    for _ in range(2):
        monitor.observe(binding, ServerState.HEALTHY, "")
    assert pool.usable()

    # When a request is refused with 401, it is refused at once and stays so while /health answers 200
    monitor.refuse(binding, credentials_refusal(401, "/generate", key_sent=True))
    for _ in range(3):
        monitor.observe(binding, ServerState.HEALTHY, "")
    assert binding.state == ServerState.REFUSED and not pool.usable() and "SGLANG_API_KEY" in binding.refusal

    # and once it goes down and comes back, the preflight judges it again
    monitor.observe(binding, ServerState.LOADING, "connection refused")
    for _ in range(2):
        monitor.observe(binding, ServerState.HEALTHY, "")
    assert binding.state == ServerState.HEALTHY and pool.usable()
