"""Prefix-cache hits: reading `meta_info.cached_tokens`, the worker's window, and status's merge."""
from __future__ import annotations

import logging

import pytest
from rich.console import Console

from contract.fleet.cache_hits import Hits, merge_servers, share, share_text
from producer.status_view import render_status
from workers.servers import cache_hits
from workers.servers.cache_hits import HitWindow


@pytest.fixture(autouse=True)
def fresh_warnings():
    cache_hits._warned.clear()
    yield
    cache_hits._warned.clear()


@pytest.mark.parametrize("value, expected", [(0, 0), (7, 7), (10, 10)])
def test_a_figure_in_range_is_the_servers(value, expected):
    assert cache_hits.cached_tokens({"cached_tokens": value}, 10, "http://s1") == expected


@pytest.mark.parametrize("meta", [{}, {"cached_tokens": None}], ids=["absent", "null"])
def test_an_older_server_or_a_cache_turned_off_is_unknown_not_zero(meta, caplog):
    with caplog.at_level(logging.WARNING):
        assert cache_hits.cached_tokens(meta, 10, "http://s1") is None
    assert not caplog.records  # not a fault: nothing to warn about


@pytest.mark.parametrize("value", [11, -1, True, 2.0, "3"], ids=["past the prompt", "negative", "bool", "float",
                                                                  "string"])
def test_a_figure_out_of_range_is_a_server_fault_warned_once_and_unknown(value, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.servers.cache_hits"):
        assert cache_hits.cached_tokens({"cached_tokens": value}, 10, "http://s1") is None
        assert cache_hits.cached_tokens({"cached_tokens": value}, 10, "http://s1") is None
        assert cache_hits.cached_tokens({"cached_tokens": value}, 10, "http://s2") is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # once per server
    assert "http://s1" in warned[0] and repr(value) in warned[0] and "[0, 10]" in warned[0]


def test_a_share_is_over_the_known_prompt_tokens_only():
    hits = Hits()
    hits.add(100, 40)
    hits.add(50, None)  # unknown: counted as sent, not in the share
    assert hits.to_dict() == {"prompt_tokens": 150, "known_prompt_tokens": 100, "cached_tokens": 40}
    assert hits.share == 0.4
    assert Hits().share is None and share(0, 0) is None
    assert share_text(0.4) == "40.0%" and share_text(0.0) == "0.0%" and share_text(None) == "-"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_keeps_the_last_minutes_and_forgets_older_buckets():
    # Given a 300 s window in 10 s buckets
    clock = Clock()
    window = HitWindow(300, 10, clock)
    window.add("http://s1", 100, 90)
    clock.now += 150
    window.add("http://s1", 100, 10)
    window.add("http://s1", 50, None)
    window.add("http://s2", 20, 0)
    # Then a snapshot sums both buckets
    assert window.snapshot() == {"window_s": 300, "servers": {
        "http://s1": {"prompt_tokens": 250, "known_prompt_tokens": 200, "cached_tokens": 100},
        "http://s2": {"prompt_tokens": 20, "known_prompt_tokens": 20, "cached_tokens": 0}}}
    # When the first bucket is 300 s old it is gone, the second still counts
    clock.now += 150
    assert window.snapshot()["servers"]["http://s1"] == {"prompt_tokens": 150, "known_prompt_tokens": 100,
                                                         "cached_tokens": 10}
    # and a server with nothing in the window drops out
    clock.now += 300
    assert window.snapshot() == {"window_s": 300, "servers": {}}


def test_the_windows_memory_is_bounded_by_its_buckets():
    # Given 10,000 generations, one every 0.7 s (7,000 s in all)
    clock = Clock()
    window = HitWindow(300, 10, clock)
    added_at = []
    for _ in range(10_000):
        window.add("http://s1", 10, 5)
        added_at.append(clock.now)
        clock.now += 0.7
    clock.now -= 0.7
    # Then it holds at most 30 buckets, and counts exactly the generations of the last 30 buckets
    assert len(window._servers["http://s1"]) <= 30
    recent = [t for t in added_at if t // 10 > clock.now // 10 - 30]
    assert 290 / 0.7 - 1 <= len(recent) <= 300 / 0.7 + 1
    assert window.snapshot()["servers"]["http://s1"]["cached_tokens"] == 5 * len(recent)


def test_status_adds_the_workers_windows_per_server_and_lists_silent_servers():
    # Given two workers bound to s1 (both) and s2, s3 (one each); s3 never said
    one = {"window_s": 300, "servers": {"http://s1": {"prompt_tokens": 100, "known_prompt_tokens": 100,
                                                      "cached_tokens": 30}}}
    two = {"window_s": 300, "servers": {"http://s1": {"prompt_tokens": 100, "known_prompt_tokens": 100,
                                                      "cached_tokens": 50},
                                        "http://s2": {"prompt_tokens": 40, "known_prompt_tokens": 0,
                                                      "cached_tokens": 0},
                                        "http://bad": "not a tally"}}
    merged = merge_servers([one, two, None], ["http://s1", "http://s2", "http://s3"])
    assert merged == [
        {"server": "http://s1", "prompt_tokens": 200, "known_prompt_tokens": 200, "cached_tokens": 80,
         "share": 0.4, "workers": 2},
        {"server": "http://s2", "prompt_tokens": 40, "known_prompt_tokens": 0, "cached_tokens": 0,
         "share": None, "workers": 1},
        {"server": "http://s3", "prompt_tokens": 0, "known_prompt_tokens": 0, "cached_tokens": 0,
         "share": None, "workers": 0}]


def test_the_status_table_shows_each_servers_share_and_a_dash_where_unknown():
    report = {"run": "r", "queue": "q", "prompts": 1, "queued": 0, "in_flight": 0, "done": 1, "dead": 0,
              "samples_per_s": 0.0, "tokens_per_s": 0.0, "finished": True, "eta_s": 0, "dead_by_reason": {},
              "workers": [], "cache_hits": {"window_s": 300, "servers": merge_servers([{"servers": {
                  "http://s1": {"prompt_tokens": 1000, "known_prompt_tokens": 1000, "cached_tokens": 375}}}],
                  ["http://s1", "http://s2"])}}
    console = Console(width=200, record=True)
    console.print(render_status(report))
    text = console.export_text()
    assert "prefix-cache hits per server, last 5 min" in " ".join(text.split())
    assert "hit share, 5 min" in text
    [s1] = [line for line in text.splitlines() if "http://s1" in line]
    [s2] = [line for line in text.splitlines() if "http://s2" in line]
    assert "1,000" in s1 and "375" in s1 and "37.5%" in s1
    assert [c.strip() for c in s2.split("│")[1:-1]] == ["http://s2", "0", "-", "-"]
