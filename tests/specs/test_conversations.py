"""Regenerated conversations: which history each turn renders, and how a conversation moves on."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contract.chat.template import ChatTokenizer
from contract.ledger.codec import pack_ids
from contract.ledger.conversation_ledger import COMPLETE, QUEUED_NEXT, ConversationLedger
from contract.chat.conversations import answer_message, skeleton, turn_history, turn_id, turns
from contract.ledger.ledger import Ledger

QWEN3_TEMPLATE = Path(__file__).parent.parent / "fixtures" / "qwen3_chat_template.jinja"
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>old reasoning</think>4, originally."},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "content": "12, originally."},
    {"role": "user", "content": "Thanks!"},
]
ANSWERS = [
    {"role": "assistant", "content": "It is 4.", "reasoning_content": "two plus two, REASONING-ZERO"},
    {"role": "assistant", "content": "It is 12.", "reasoning_content": "four times three, REASONING-ONE"},
]


@pytest.fixture(scope="module")
def bundled() -> ChatTokenizer:
    return ChatTokenizer("bundled")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> ChatTokenizer:
    """The bundled vocabulary with Qwen3-8B's own chat template (tests/fixtures)."""
    from contract.chat.bundled import bundled_tokenizer_dir

    folder = tmp_path_factory.mktemp("qwen3") / "tok"
    shutil.copytree(bundled_tokenizer_dir(), folder)
    (folder / "chat_template.jinja").write_text(QWEN3_TEMPLATE.read_text())
    return ChatTokenizer(str(folder))


def expected_history(turn: int) -> list[dict]:
    """By hand: the system message, user turns up to `turn`, the model's own earlier answers."""
    users = [m for m in CONVERSATION if m["role"] == "user"]
    history = [CONVERSATION[0]]
    for i in range(turn):
        history += [users[i], ANSWERS[i]]
    return history + [users[turn]]


def test_a_conversation_regenerates_one_turn_per_answered_user_message_and_one_for_its_last():
    assert turns(skeleton(CONVERSATION)) == 3
    assert turns(skeleton(CONVERSATION[:-1])) == 2  # ends on an assistant answer: that answer is turn 1
    assert turns(skeleton([{"role": "user", "content": "hi"}])) == 1


@pytest.mark.parametrize("turn", [0, 1, 2])
def test_turn_k_renders_the_system_message_user_turns_up_to_k_and_the_models_own_earlier_answers(turn):
    assert turn_history(skeleton(CONVERSATION), ANSWERS[:turn], turn) == expected_history(turn)


@pytest.mark.parametrize("template", ["bundled", "qwen3"])
@pytest.mark.parametrize("turn", [0, 1, 2])
def test_a_turns_prompt_ids_are_the_templates_rendering_of_its_history(template, turn, request):
    # Given the bundled R1-style template, or Qwen3-8B's
    chat = request.getfixturevalue(template)
    # When turn k's prompt is rendered the way the fleet renders it
    ids = chat.render([turn_history(skeleton(CONVERSATION), ANSWERS[:turn], turn)])[0]
    # Then it is exactly apply_chat_template of the expected history
    expected = chat.tok.apply_chat_template(expected_history(turn), add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    assert ids == list(expected)
    text = chat.tok.decode(ids)
    # and the original answers are gone, the regenerated answers are in, earlier reasoning is not
    assert "originally" not in text and "old reasoning" not in text
    assert all(a["content"] in text for a in ANSWERS[:turn])
    assert "REASONING" not in text


def test_qwen3_drops_the_reasoning_of_earlier_turns_exactly_as_if_it_had_never_been_sent(qwen3):
    history = turn_history(skeleton(CONVERSATION), ANSWERS, 2)
    without = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in history]
    assert qwen3.render([history]) == qwen3.render([without])


def test_tool_and_system_messages_stay_where_they_were_and_extra_answers_are_dropped():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "calling a tool"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "ok"},
    ]
    shape = skeleton(messages)
    assert turns(shape) == 2
    answers = [{"role": "assistant", "content": "A0"}, {"role": "assistant", "content": "A1"}]
    assert turn_history(shape, answers, 1) == [messages[0], answers[0], messages[2], messages[4], messages[5]]


def test_an_assistant_message_before_the_first_user_message_is_dropped_not_answered_for():
    shape = skeleton([{"role": "assistant", "content": "Hello, how can I help?"},
                      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "original"}])
    assert turns(shape) == 1
    assert turn_history(shape, [], 0) == [{"role": "user", "content": "hi"}]


def test_an_answer_is_the_output_after_think_end_without_its_stop_token_and_the_reasoning_beside_it(bundled):
    tok = bundled.tok
    reasoning, answer = tok.encode(" let me see ", add_special_tokens=False), tok.encode(" Four. ", add_special_tokens=False)
    eos = bundled.stop_ids()[0]
    output = reasoning + [bundled.think_end_id] + answer + [eos]
    message = answer_message(output, bundled.think_start_id, bundled.think_end_id, bundled.stop_ids(),
                             lambda ids: tok.decode(ids, skip_special_tokens=False))
    assert message == {"role": "assistant", "content": "Four.", "reasoning_content": "let me see"}


def _start(client, run: str, conversation: str, n: int) -> tuple[ConversationLedger, Ledger]:
    conversations, ledger = ConversationLedger(client, run), Ledger(client, run)
    assert conversations.register([(conversation, n, skeleton(CONVERSATION))]) == [1]
    ledger.enqueue([(turn_id(conversation, 0), pack_ids([1, 2, 3]))])
    return conversations, ledger


def test_a_stored_turn_queues_the_next_once_however_many_times_it_is_reported(client):
    # Given a conversation of 3 turns whose turn 0 is stored
    conversations, ledger = _start(client, "r", "c", 3)
    assert conversations.advance("c", 0, ANSWERS[0], 3, [4, 5]) == "queued"  # not stored yet: nothing moves
    assert ledger.state("c#1") is None
    ledger.mark_done("c#0", 7, shard="part-a.parquet")
    # When it is reported twice (a redelivery, the audit)
    first = conversations.advance("c", 0, ANSWERS[0], 3, [4, 5, 6])
    again = conversations.advance("c", 0, {"role": "assistant", "content": "other"}, 3, [9])
    # Then turn 1 is queued once, with the first report's ids and answer
    assert (first, again) == (QUEUED_NEXT, "stale")
    assert ledger.intake("c#1")[0] == pack_ids([4, 5, 6])
    assert conversations.answers("c", 1) == [ANSWERS[0]]
    assert ledger.tally().enqueued == 2 and ledger.tally().queued == 1


def test_the_last_stored_turn_completes_the_conversation_and_frees_its_entries(client):
    conversations, ledger = _start(client, "r", "c", 2)
    ledger.mark_done("c#0", 7, "part-a.parquet")
    assert conversations.advance("c", 0, ANSWERS[0], 2, [4], server="http://gpu-1:30000") == QUEUED_NEXT
    assert conversations.server("c") == "http://gpu-1:30000"  # where turn 1's prefix is cached
    ledger.mark_done("c#1", 7, "part-a.parquet")
    assert conversations.advance("c", 1, ANSWERS[1], 2, server="http://gpu-2:30000") == COMPLETE
    assert conversations.in_progress("c") is None and conversations.turns(["c"]) == [2]
    assert conversations.server("c") is None
    assert not client.exists(conversations.keys.conversation_answers)
    assert not client.exists(conversations.keys.conversation_server)
    counters = ledger.counters()
    assert counters["conversations"] == 1 and counters["conversations_complete"] == 1
    assert counters["conversation_turns"] == 2 and ledger.tally().done == 2


def test_a_turn_that_cannot_be_rendered_stops_its_conversation_as_a_dead_letter(client):
    conversations, ledger = _start(client, "r", "c", 3)
    ledger.mark_done("c#0", 7, "part-a.parquet")
    letter = json.dumps({"reason": "worker_error", "id": "c#1"})
    assert conversations.advance("c", 0, ANSWERS[0], 3, letter=("worker_error", letter)) == "buried"
    assert ledger.state("c#1") == "dead" and ledger.tally().reasons == {"worker_error": 1}
    assert conversations.in_progress("c").at == 1


def test_a_worker_whose_template_differs_from_the_runs_refuses_to_render_its_turns(bundled):
    from contract.run.spec import RunSpec
    from workers.output.turns import TemplateMismatch, chat_for

    spec = RunSpec(name="r", tokenizer="bundled", tokenizer_fingerprint=bundled.fingerprint(),
                   template_fingerprint=bundled.template_fingerprint(), sampling={}, thinking="prompt",
                   think_start_id=bundled.think_start_id, think_end_id=bundled.think_end_id, stop_ids=[], turns="all")
    assert chat_for(spec).template_fingerprint() == spec.template_fingerprint
    other = RunSpec(**{**spec.__dict__, "template_fingerprint": "another-template"})
    with pytest.raises(TemplateMismatch):
        chat_for(other)


def test_a_run_keeps_earlier_reasoning_only_when_its_template_renders_it(bundled, qwen3, tmp_path):
    # Given the bundled and Qwen3 templates, which drop earlier turns' reasoning, and one that renders it
    from contract.chat.bundled import bundled_tokenizer_dir

    folder = tmp_path / "keeps"
    shutil.copytree(bundled_tokenizer_dir(), folder)
    (folder / "chat_template.jinja").write_text(
        "{%- for m in messages -%}{{ m['role'] }}: {{ m.get('reasoning_content', '') }} {{ m['content'] }}\n"
        "{%- endfor -%}{%- if add_generation_prompt -%}assistant: <think>{%- endif -%}")
    keeps = ChatTokenizer(str(folder))
    # Then only the last says a conversation must keep its answers' reasoning for later turns
    assert (bundled.renders_history_reasoning(), qwen3.renders_history_reasoning()) == (False, False)
    assert keeps.renders_history_reasoning()
