"""Specification: an until-verified sample that does not pass queues the next of its chain, once
(workers/intake/chains.py), with a real Redis as broker and ledger."""
from __future__ import annotations

from types import SimpleNamespace

from contract.broker.config import celery_app
from contract.ledger.codec import unpack_ids
from contract.broker.kombu_redis import queue_depth
from contract.ledger.ledger import Ledger
from contract.run.spec import RunSpec
from workers.intake.chains import follow

QUEUE = "fleet.generate"


def spec(until_verified: int | None = 2) -> RunSpec:
    return RunSpec(name="r", tokenizer="t", tokenizer_fingerprint="t", template_fingerprint="g", sampling={},
                   thinking="prompt", think_start_id=1, think_end_id=2, stop_ids=[3], samples=5,
                   until_verified=until_verified, verify="exact")


def runtime(client):
    return SimpleNamespace(redis=client, settings=SimpleNamespace(queue_prefix=QUEUE))


def test_a_failed_sample_queues_the_next_of_its_chain_once_with_the_prompts_ids(client, server):
    # Given a run of up to 5 samples a prompt until 2 pass (chains 0, 2, 4 and 1, 3)
    app, rt = celery_app(server, queue=QUEUE), runtime(client)

    # When sample 0 does not pass, and its worker dies and a second delivery does the same again
    first = follow(rt, spec(), "q~0", [7, 8, 9], app=app)
    again = follow(rt, spec(), "q~0", [7, 8, 9], app=app)

    # Then sample 2 is queued once, with the prompt's ids and one message, and the second call queued nothing
    assert (first, again) == ("q~2", None)
    ledger = Ledger(client, "r")
    assert ledger.states(["q~2", "q~1", "q~3"]) == ["queued", None, None]
    assert unpack_ids(client.hget(ledger.keys.token_ids, "q~2")) == [7, 8, 9]
    assert queue_depth(client, QUEUE) == 1
    # and it counts no new prompt (sample 0 did, at enqueue)
    assert ledger.tally().prompts is None


def test_a_chain_ends_at_n_and_a_run_without_until_verified_queues_nothing(client, server):
    app, rt = celery_app(server, queue=QUEUE), runtime(client)
    # sample 3's successor would be 5, past the 5 samples; sample 4's, 6
    assert follow(rt, spec(), "q~3", [7], app=app) is None and follow(rt, spec(), "q~4", [7], app=app) is None
    assert follow(rt, spec(None), "q~0", [7], app=app) is None
    assert queue_depth(client, QUEUE) == 0 and not client.keys("fleet:run:r:*")
