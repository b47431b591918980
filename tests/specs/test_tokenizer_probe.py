"""The tokenizer probe (contract/chat/tokenizer_probe.py): what `enqueue` records, and where a server's ids differ.

Given the bundled tokenizer, the probe holds a rendered conversation and every added and special token
with their ids; given the same tokenizer with tokens added, a server of the base tokenizer differs at the
first added token, and the difference names the text, the position and both ids.
"""
from __future__ import annotations

import copy

import pytest

from contract.chat.tokenizer_probe import Probe, first_difference, make_probe


@pytest.fixture(scope="module")
def probe(tokenizer) -> Probe:
    return make_probe(tokenizer)


def test_the_probe_holds_a_rendered_conversation_and_every_added_and_special_token(tokenizer, probe):
    assert probe.texts[0].endswith("<｜Assistant｜><think>") and "你好" in probe.texts[0]
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    assert added <= set(probe.texts[1:]) and "<think>" in probe.texts
    assert probe.ids[probe.texts.index("<think>")] == [128821]
    assert max(max(ids) for ids in probe.ids if ids) == len(tokenizer) - 1  # the highest id is probed


def test_a_server_with_the_same_tokenizer_differs_nowhere(probe):
    assert first_difference(probe, [list(ids) for ids in probe.ids]) is None


def test_a_tokenizer_with_added_tokens_differs_from_its_base_at_the_first_added_token(tokenizer, probe):
    extended = copy.deepcopy(tokenizer)
    extended.add_tokens(["<tool_a>"], special_tokens=True)
    ours = make_probe(extended)
    theirs = [tokenizer.encode(text, add_special_tokens=False) for text in ours.texts]  # the base server's ids

    difference = first_difference(ours, theirs)

    assert difference is not None and difference.text == "<tool_a>" and difference.position == 0
    assert difference.ours == len(tokenizer) and difference.theirs != len(tokenizer)
    assert f"gives id {len(tokenizer)} at position 0" in str(difference)


def test_an_answer_of_another_length_is_a_difference(probe):
    assert first_difference(probe, probe.ids[:-1]) is not None


def test_the_probe_survives_the_spec_and_is_named_by_its_content(probe):
    again = Probe.from_dict(probe.to_dict())
    assert again == probe and again.digest == probe.digest
    assert Probe(probe.texts, [[1], *probe.ids[1:]]).digest != probe.digest
    assert Probe.from_dict(None) is None  # a run enqueued before the probe
