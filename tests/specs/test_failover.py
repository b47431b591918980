"""After a failover: what a worker asserts again on the new primary, and how long it remembers it."""
from __future__ import annotations

from contract.ledger.codec import pack_ids
from contract.ledger.ledger import Ledger
from workers.intake import deliveries
from workers.intake.recent import Recent


def test_a_held_prompt_is_noted_again_once_and_a_finished_one_not_at_all(client):
    # Given a prompt still to be stored, whose delivery note to w1 the new primary lacks
    ledger = Ledger(client, "r")
    ledger.enqueue([("p1", pack_ids([1, 2, 3])), ("p2", pack_ids([4, 5]))])
    deliveries.note(client, "r", "p1", "w0")  # an earlier delivery, kept

    # When w1 asserts that it holds it, twice (two failovers in a row)
    assert deliveries.hold(client, "r", "p1", "w1")
    assert not deliveries.hold(client, "r", "p1", "w1")

    # Then it is noted once, after the earlier delivery: one more delivery, as the lost note was
    assert deliveries.holders(client, "r", "p1") == ["w0", "w1"]

    # And a prompt stored meanwhile (no ids left) gets no note, which nothing would clear
    ledger.mark_group_done([("p2", 2)], "/shards/part-1.parquet")
    assert not deliveries.hold(client, "r", "p2", "w1")
    assert deliveries.holders(client, "r", "p2") == []


def test_what_was_written_lately_is_kept_for_its_window_only():
    clock = [100.0]
    recent = Recent(10.0, clock=lambda: clock[0])
    recent.add("a")
    clock[0] = 105.0
    recent.add("b")
    assert recent.items() == ["a", "b"]
    clock[0] = 112.0  # a is 12 s old, b 7 s
    assert recent.items() == ["b"]


def test_a_primary_without_min_replicas_to_write_is_named_once_at_start(client, caplog):
    from workers.intake.failover import warn_without_min_replicas

    # Given a primary that takes writes with no replica to confirm them (Redis's default)
    client.config_set("min-replicas-to-write", 0)
    warn_without_min_replicas(client, "sentinel://:secret@127.0.0.1:26379/0")
    assert "runs without min-replicas-to-write" in caplog.text and "secret" not in caplog.text

    # And one that refuses them when cut off from its replicas says nothing
    caplog.clear()
    client.config_set("min-replicas-to-write", 1)
    try:
        warn_without_min_replicas(client, "sentinel://127.0.0.1:26379/0")
        assert caplog.text == ""
    finally:
        client.config_set("min-replicas-to-write", 0)
