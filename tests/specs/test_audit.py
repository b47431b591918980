"""The audit's rule for a lost message: missing at two audits of its run in a row, never longer apart.

A prompt whose message is in passing (taken from the queue and not yet
recorded as unacknowledged, or recorded by a producer and not yet published)
is missing from every list once; a prompt missing twice in a row lost its
message. Given what successive audits of a run find missing, then the
prompts confirmed lost are exactly those missing at the run's previous audit
and now, and an audit that skipped the run (its queue too deep to list) ends
every earlier sighting of it.
"""
from __future__ import annotations

from workers.audit import Suspects


def test_a_prompt_missing_once_is_not_republished():
    # Given a first audit that finds p-1 missing
    suspects = Suspects()
    # When it is the first sighting, then nothing is confirmed
    assert suspects.confirm("run", {"p-1"}) == set()
    # and when the next audit finds it again (its message came in the meantime), still nothing
    assert suspects.confirm("run", set()) == set()
    assert suspects.confirm("run", {"p-1"}) == set()


def test_a_prompt_missing_at_two_audits_in_a_row_is_confirmed_once():
    # Given p-1 and p-2 missing at one audit
    suspects = Suspects()
    suspects.confirm("run", {"p-1", "p-2"})
    # When the next audit finds p-1 (and a new p-3) missing
    confirmed = suspects.confirm("run", {"p-1", "p-3"})
    # Then p-1 is confirmed lost, p-3 is a suspect, p-2 is forgotten
    assert confirmed == {"p-1"}
    assert suspects.confirm("run", {"p-2", "p-3"}) == {"p-3"}
    # and a confirmed prompt (republished) starts over: one more sighting does not confirm it
    assert suspects.confirm("run", {"p-1"}) == set()


def test_a_skipped_audit_ends_the_runs_earlier_sightings():
    # Given p-1 of run a and p-9 of run b missing at one audit
    suspects = Suspects()
    suspects.confirm("a", {"p-1"})
    suspects.confirm("b", {"p-9"})
    # When the next audit skips run a (its queue too deep to list) and audits run b
    suspects.keep_only({"b"})
    # Then a later sighting of p-1 is its first again, while run b's confirmation stands
    assert suspects.confirm("b", {"p-9"}) == {"p-9"}
    assert suspects.confirm("a", {"p-1"}) == set()
    assert suspects.confirm("a", {"p-1"}) == {"p-1"}


def test_runs_do_not_confirm_each_others_prompts():
    suspects = Suspects()
    suspects.confirm("a", {"p-1"})
    assert suspects.confirm("b", {"p-1"}) == set()
