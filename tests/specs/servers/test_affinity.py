"""Affinity: a prompt goes where its prefix is cached, unless that server is loaded beyond the margin.

Given bindings set by hand (the state the health monitor and the tuner would
have given them), when task threads acquire slots with a preferred server,
then they land on it while the load guard allows, on the least loaded server
beyond it, and never on a server that is unhealthy, refused, of another model
or at its target. The memory of recent prefixes stays bounded whatever the
run's size, and a conversation's next turn prefers the server the ledger
recorded for its last turn.
"""
from __future__ import annotations

import threading

import pytest

from contract.ledger.codec import pack_ids
from contract.ledger.conversation_ledger import ConversationLedger
from contract.chat.conversations import skeleton
from contract.ledger.ledger import Ledger
from contract.names import ServerState
from workers.servers.affinity import BLOCK, MAX_BLOCKS, MOVE_AFTER, Affinity, RecentPrefixes, block_keys, load
from workers.servers.capacity import Load
from workers.servers.bindings import PENDING_WAIT, ServerPool

from waiting import wait_until


def pool(*urls: str, capacity: int = 16, margin: float = 0.125, model: str = "m",
         pending_wait: float = 0.0, max_inflight: int = 1024) -> ServerPool:
    """Healthy, preflighted servers of `capacity` (target: capacity + 2, or `max_inflight` where less),
    past the start's wait for an unjudged preferred server unless `pending_wait` says otherwise."""
    p = ServerPool(list(urls), max_inflight, margin, pending_wait=pending_wait)
    for binding in p.bindings:
        binding.state, binding.preflighted, binding.model_path = ServerState.HEALTHY, True, model
        binding.tuner.reset(capacity)
    return p


def busy(p: ServerPool, **in_flight: int) -> None:
    for binding in p.bindings:
        binding.in_flight = in_flight.get(binding.url, 0)


def chosen(p: ServerPool, prefer: str | None, avoid: str | None = None, model: str = "m") -> str:
    with p.acquire(model, 0.05, avoid=avoid, prefer=prefer) as binding:
        return binding.url


def test_the_preferred_server_is_taken_while_its_load_is_within_the_margin_of_the_least_loaded():
    # Given two servers of capacity 16, margin an eighth (2 requests)
    p = pool("a", "b")
    # When the preferred one holds 2 more requests than the other, it keeps the prompt
    busy(p, a=10, b=8)
    assert chosen(p, prefer="a") == "a"
    # and at 3 more (beyond the margin) load wins, as the gateway does
    busy(p, a=11, b=8)
    assert chosen(p, prefer="a") == "b"


def test_a_tie_goes_to_the_preferred_server_and_no_preference_goes_to_the_least_loaded():
    p = pool("a", "b", "c")
    busy(p, a=5, b=5, c=5)
    assert chosen(p, prefer="c") == "c"
    busy(p, a=5, b=3, c=5)
    assert chosen(p, prefer=None) == "b"


def test_the_load_guard_counts_what_the_server_reports_beside_this_workers_own_requests():
    # Given another worker filling server a: this worker holds nothing there, a reports 18 running
    p = pool("a", "b")
    p.observe_load(p.bindings[0], Load(running=16, waiting=2))
    # Then a prompt that prefers a goes to b
    assert load(p.bindings[0]) == pytest.approx(18 / 16)
    assert chosen(p, prefer="a") == "b"


def test_under_a_cap_below_the_batch_the_guard_counts_load_against_the_cap_and_no_server_idles():
    # Given two servers of capacity 64 and a worker held to 4 requests on each (FLEET_MAX_INFLIGHT_PER_SERVER),
    # margin a quarter: the preferred one holds all 4 of its slots, the other none
    p = pool("a", "b", capacity=64, margin=0.25, max_inflight=4)
    busy(p, a=4, b=0)
    # Then the prompt that prefers a goes to b rather than wait while b has free slots (4 of 64 would be
    # within the margin as a share of the batch; 4 of 4 is not)
    assert load(p.bindings[0]) == pytest.approx(1.0)
    assert chosen(p, prefer="a") == "b"
    # and within a quarter of the cap (one request more than the other) it keeps the prompt
    busy(p, a=2, b=1)
    assert chosen(p, prefer="a") == "a"


@pytest.mark.parametrize("state", ["unknown", "loading", "warming", "down", "refused"])
def test_a_server_that_is_not_healthy_is_never_chosen_for_affinity(state):
    p = pool("a", "b")
    p.bindings[0].state = ServerState(state)
    assert chosen(p, prefer="a") == "b"


def test_a_refused_or_unpreflighted_server_or_one_of_another_model_is_never_chosen_for_affinity():
    p = pool("a", "b")
    p.bindings[0].refusal = "401 from /generate"
    assert chosen(p, prefer="a") == "b"
    p = pool("a", "b")
    p.bindings[0].preflighted = False
    assert chosen(p, prefer="a") == "b"
    p = pool("a", "b")
    p.bindings[0].model_path = "other"
    assert chosen(p, prefer="a") == "b"


def test_a_retry_avoids_its_failed_server_even_when_its_prefix_is_cached_there():
    p = pool("a", "b")
    assert chosen(p, prefer="a", avoid="a") == "b"


def test_a_preferred_server_that_is_unknown_to_this_worker_is_no_preference():
    p = pool("a", "b")
    busy(p, a=4, b=0)
    assert chosen(p, prefer="http://elsewhere:30000") == "b"


def test_a_prompt_never_exceeds_its_preferred_servers_target_it_waits_for_a_slot_there():
    # Given a preferred server at its target (18) and another one request below (within the margin)
    p = pool("a", "b")
    busy(p, a=18, b=17)
    landed, waiter = waiting_for(p, "a", "the prompt waiting for a slot on a")
    # When a slot frees on a
    with p._lock:
        p.bindings[0].in_flight -= 1
        p._wake(p.bindings[0])
    waiter.join(5)
    # Then the waiting prompt took it, and a was never above its target
    assert landed == ["a"] and p.bindings[0].in_flight == 17


def waiting_for(p: ServerPool, prefer: str, what: str) -> tuple[list[str], threading.Thread]:
    """A prompt preferring `prefer`, started in a thread and seen waiting there; the list its
    chosen server lands in, and the thread."""
    landed: list[str] = []
    waiter = threading.Thread(target=lambda: landed.append(chosen_waiting(p, prefer)))
    waiter.start()
    wait_until(lambda: p._waiting[prefer] == 1, 5, what)
    return landed, waiter


def chosen_waiting(p: ServerPool, prefer: str) -> str:
    with p.acquire("m", 5, prefer=prefer) as binding:
        assert binding.in_flight <= binding.target
        return binding.url


def test_right_after_the_start_a_prompt_waits_for_its_preferred_server_still_being_judged():
    # Given a worker just started: b checked and ready, a (the conversation's server) not yet judged
    p = pool("a", "b", pending_wait=PENDING_WAIT)
    p.bindings[0].state, p.bindings[0].preflighted = ServerState.UNKNOWN, False
    landed, waiter = waiting_for(p, "a", "the prompt waiting for a's first verdict")
    # When a's health checks and preflight find it ready
    p.bindings[0].state, p.bindings[0].preflighted = ServerState.HEALTHY, True
    p.changed()
    waiter.join(5)
    # Then the prompt went to a, not to the server checked first
    assert landed == ["a"]
    # and a preferred server found loading at first look is not waited for
    p.bindings[0].state, p.bindings[0].preflighted = ServerState.LOADING, False
    assert chosen(p, prefer="a") == "b"


def test_past_the_start_a_preferred_server_still_being_judged_is_not_waited_for():
    p = pool("a", "b", pending_wait=0.0)
    p.bindings[0].state, p.bindings[0].preflighted = ServerState.UNKNOWN, False
    assert chosen(p, prefer="a") == "b"


def test_a_prompt_waiting_for_its_preferred_server_moves_once_another_falls_beyond_the_margin():
    # Given a prompt waiting for its full preferred server a, b one request below
    p = pool("a", "b")
    busy(p, a=18, b=17)
    landed, waiter = waiting_for(p, "a", "the prompt waiting for a slot on a")
    # When b's requests finish until it holds more than the margin less than a
    for _ in range(2):
        with p._lock:
            p.bindings[1].in_flight -= 1
            p._wake(p.bindings[1])
    waiter.join(5)
    # Then load wins: the prompt went to b
    assert landed == ["b"]


def test_the_leading_blocks_of_prompts_that_share_a_prefix_match_and_short_prompts_match_only_themselves():
    system = list(range(1000, 1000 + 3 * BLOCK + 10))
    one, two = block_keys(system + [1, 2, 3] * 40), block_keys(system + [7, 8, 9] * 40)
    assert one[:3] == two[:3] and one[3] != two[3]
    # a prompt shorter than a block has only its whole prompt's key: the same prompt's (its samples'), no other's
    short = list(range(BLOCK - 1))
    assert len(block_keys(short)) == 1 and block_keys(short) == block_keys(list(short))
    assert block_keys(short) != block_keys(short[:-1]) and block_keys(short[:-1] + [7]) != block_keys(short)
    # a prompt ending within a block: its whole blocks' keys, then its own (its samples')
    assert len(block_keys(system)) == 4 and block_keys(system)[:3] == one[:3]
    assert len(block_keys(list(range(2 * BLOCK)))) == 2  # whole blocks only: nothing more to key
    assert len(block_keys(list(range(BLOCK * (MAX_BLOCKS + 5))))) == MAX_BLOCKS


def test_the_samples_of_a_short_prompt_follow_the_first_to_its_server():
    recent = RecentPrefixes()
    prompt = list(range(40))  # shorter than a block
    recent.sent(block_keys(prompt), "a")
    assert recent.server_for(block_keys(list(prompt))) == "a"
    assert recent.server_for(block_keys(prompt[:-1] + [99])) is None


def test_a_prompt_goes_where_the_longest_run_of_its_leading_blocks_was_last_sent():
    recent = RecentPrefixes()
    system = list(range(5000, 5000 + 2 * BLOCK))
    recent.sent(block_keys(system + list(range(3 * BLOCK))), "a")      # the system prompt and more, to a
    recent.sent(block_keys(system), "b")                                # the system prompt alone, to b later
    assert recent.server_for(block_keys(system + list(range(3 * BLOCK)))) == "a"   # the longer match
    assert recent.server_for(block_keys(system + [9] * BLOCK)) == "b"              # the most recent
    assert recent.server_for(block_keys(list(range(4 * BLOCK)))) is None


def test_the_memory_of_recent_prefixes_is_bounded_and_keeps_the_prefixes_still_sent():
    recent = RecentPrefixes(entries=256)
    shared = list(range(90_000, 90_000 + BLOCK))
    for i in range(2_000):
        recent.sent(block_keys(shared + [i] * (4 * BLOCK)), f"s{i % 4}")
        assert len(recent) <= 256
    assert recent.server_for(block_keys(shared)) == "s3"  # the last server it was sent to


def test_a_conversations_next_turn_prefers_the_server_of_its_last_turn_as_the_ledger_records_it(client):
    # Given a conversation whose turn 0 was stored from server a
    conversations, ledger = ConversationLedger(client, "r"), Ledger(client, "r")
    shape = skeleton([{"role": "user", "content": "q0"}, {"role": "user", "content": "q1"}])
    conversations.register([("c", 2, shape)])
    ledger.enqueue([("c#0", pack_ids([1, 2, 3]))])
    ledger.mark_done("c#0", 7, "part-a.parquet")
    conversations.advance("c", 0, {"role": "assistant", "content": "A0"}, 2, [4, 5], server="http://a")
    # When any worker routes turn 1
    route = Affinity().route(client, "r", True, "c#1", [4, 5])
    # Then it prefers a; a first turn, a run of single prompts, or affinity off prefer nothing
    assert (route.prefer, route.why) == ("http://a", "conversation")
    assert Affinity().route(client, "r", True, "c#0", [1, 2, 3]).prefer is None
    assert Affinity().route(client, "r", False, "c#1", [4, 5]).prefer is None
    assert Affinity(enabled=False).route(client, "r", True, "c#1", [4, 5]).prefer is None


def test_with_affinity_off_a_prompt_is_routed_by_load_alone():
    affinity = Affinity(enabled=False)
    prompt = list(range(4 * BLOCK))
    affinity.sent(affinity.route(None, "r", False, "p", prompt), "a")
    assert affinity.route(None, "r", False, "q", prompt).prefer is None and len(affinity.prefixes) == 0
    on = Affinity()
    on.sent(on.route(None, "r", False, "p", prompt), "a")
    assert on.route(None, "r", False, "q", prompt).prefer == "a"


def test_a_prompt_the_guard_spills_leaves_its_prefix_where_it_was_and_a_down_server_moves_it():
    # Given a prefix last sent to a
    p, affinity = pool("a", "b"), Affinity()
    prompt = list(range(4 * BLOCK))
    affinity.sent(affinity.route(None, "r", False, "p0", prompt), "a")
    # When a is loaded beyond the margin, the next prompt of that prefix is spilled to b
    busy(p, a=12, b=0)
    route = affinity.route(None, "r", False, "p1", prompt)
    with p.acquire("m", 0.05, prefer=route.prefer) as binding:
        assert binding.url == "b"
        affinity.sent(route, binding.url, p.spilled(route.prefer, binding, "m"))
    # Then the prefix still points at a, whose cache holds it
    assert affinity.route(None, "r", False, "p2", prompt).prefer == "a"
    # but spills in a row (a stays loaded) move it to where they went
    for i in range(MOVE_AFTER - 1):
        affinity.sent(affinity.route(None, "r", False, f"s{i}", prompt), "b", spilled=True)
    assert affinity.route(None, "r", False, "p3", prompt).prefer == "b"
    affinity.sent(affinity.route(None, "r", False, "p4", prompt), "a")
    # and once a is down, the prompt that goes to b moves it there at once
    p.bindings[0].state = ServerState.DOWN
    route = affinity.route(None, "r", False, "p5", prompt)
    with p.acquire("m", 0.05, prefer=route.prefer) as binding:
        affinity.sent(route, binding.url, p.spilled(route.prefer, binding, "m"))
    assert affinity.route(None, "r", False, "p6", prompt).prefer == "b"


def test_samples_of_one_prompt_routed_together_follow_the_first_to_its_server():
    # Given three samples of one new prompt (identical ids) whose routes were all read before any
    # was sent (their tasks started together), on two idle servers
    p, affinity = pool("a", "b"), Affinity()
    prompt = list(range(40))
    routes = [affinity.route(None, "r", False, f"q~{i}", prompt) for i in range(3)]
    assert all(route.prefer is None for route in routes)

    # When each takes a slot, the way a worker's request does, holding it
    held = []
    for route in routes:
        context = p.acquire("m", 0.05, prefer=route.prefer, lookup=lambda route=route: affinity.prefer(route),
                            placed=lambda chosen, wanted, route=route: affinity.sent(
                                route, chosen.url, p.spilled(wanted, chosen, "m")))
        held.append((context, context.__enter__()))

    # Then all three went where the first did (the guard allowing), not one to each server by load
    assert len({binding.url for _, binding in held}) == 1
    for context, _ in held:
        context.__exit__(None, None, None)
