"""The trainers' formats (`export --format`), from rows built here and a real redis-server ledger:
the loss mask is 1 exactly on generated tokens, every format holds the Parquet export's rows,
and the manifest's figures say the same of each."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contract.ledger.codec import pack_ids
from contract.ledger.deadletters import DeadLetter, DeadLetters
from contract.ledger.ledger import Ledger
from contract.storage.schema import Sample, samples_to_table
from contract.run.spec import RunSpec
from contract.chat.template import ChatTokenizer
from producer.export import export_run
from producer.formats import FormatRefused
from producer.formats.figures import Figures, ids_digest
from producer.formats.rows import Row, loss_mask, token_line
from producer.formats import specforge, text
from producer.formats.text import answer_message

RUN = "r"
THINK_START, THINK_END, EOS = 128821, 128822, 1


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    return ChatTokenizer("bundled")


def spec(chat: ChatTokenizer, thinking: str = "prompt") -> RunSpec:
    return RunSpec(name=RUN, tokenizer="bundled", tokenizer_fingerprint=chat.fingerprint(),
                   template_fingerprint=chat.template_fingerprint(), sampling={"max_new_tokens": 64},
                   thinking=thinking, think_start_id=THINK_START, think_end_id=THINK_END, stop_ids=[EOS])


def sample(prompt_id: str, prompt: list[int], output: list[int], conversation: str | None = None,
           turn: int | None = None) -> Sample:
    now = datetime.now(timezone.utc)
    end = output.index(THINK_END) if THINK_END in output else None
    return Sample(id=prompt_id, input_ids=prompt + output, prompt_len=len(prompt), output_len=len(output),
                  finish_reason="stop", stop_token=EOS if output[-1:] == [EOS] else None,
                  think_end_index=None if end is None else len(prompt) + end, run=RUN, server="s", model="m",
                  max_new_tokens=64, temperature=0.6, top_p=0.95, attempts=1, worker="w", tokenizer_fingerprint="t",
                  template_fingerprint="t", e2e_latency=0.1, started_at=now, finished_at=now,
                  conversation=conversation, turn=turn)


def row_of(s: Sample) -> Row:
    return Row(id=s.id, input_ids=s.input_ids, prompt_len=s.prompt_len, output_len=s.output_len,
               finish_reason=s.finish_reason, stop_token=s.stop_token, think_end_index=s.think_end_index,
               conversation=s.conversation, turn=s.turn)


def records(dest: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (dest / name).read_text().splitlines()]


# -- the loss mask ---------------------------------------------------------------------------------

def test_the_loss_mask_is_one_exactly_on_generated_tokens_and_zero_on_the_templates_think_start():
    # Given a prompt the template ended with think-start, and the model's output
    prompt, output = [0, 11, 12, THINK_START], [20, 21, THINK_END, 30, EOS]
    # When it becomes a trainer's record
    record = json.loads(token_line(row_of(sample("a", prompt, output))))
    # Then the ids are the prompt's then the output's, and only the output is masked 1
    assert record == {"id": "a", "input_ids": prompt + output, "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1]}
    assert record["loss_mask"][record["input_ids"].index(THINK_START)] == 0


def test_each_sample_of_a_prompt_is_a_line_of_its_own_name(chat):
    # Given three samples of prompt "a" in a run of three samples a prompt
    many = RunSpec(**{**spec(chat).__dict__, "samples": 3})
    rows = [replace(row_of(sample("a", [0, 11], [20 + i, THINK_END, EOS])), sample=i) for i in range(3)]
    # When they become the trainers' lines, and text lines
    lines = [json.loads(specforge.line_maker(many, {})(row)) for row in rows]
    texts = [json.loads(text.line_maker(many, {})(row)) for row in rows]
    # Then each trainer's line names its sample, `<id>~<index>`, as the ledger does: no two share an id
    assert [line["id"] for line in lines] == ["a~0", "a~1", "a~2"]
    assert [line["input_ids"][2] for line in lines] == [20, 21, 22]
    # and each text line keeps the prompt's id, with the sample's index beside it
    assert [(t["id"], t["sample"]) for t in texts] == [("a", 0), ("a", 1), ("a", 2)]
    # and in a run of one sample a prompt the id is the prompt's alone
    assert json.loads(specforge.line_maker(spec(chat), {})(rows[0]))["id"] == "a"


def test_a_think_start_the_model_generated_is_masked_one():
    # Given a run whose model opens its reasoning itself (--thinking output)
    prompt, output = [0, 11, 12], [THINK_START, 20, THINK_END, 30, EOS]
    # Then the think-start it generated is learned like every generated token
    assert loss_mask(row_of(sample("a", prompt, output))) == [0, 0, 0, 1, 1, 1, 1, 1]


def test_an_empty_output_is_an_all_zero_mask_and_is_counted():
    # Given a row with no generated token
    row = row_of(sample("a", [0, 11, THINK_START], []))
    # Then its mask is all zero (the trainers drop such rows) and the figures count it
    assert json.loads(token_line(row))["loss_mask"] == [0, 0, 0]
    figures = Figures()
    figures.add(row)
    assert figures.to_dict()["rows_without_generated_tokens"] == 1


def test_the_figures_sum_tokens_and_digest_the_id_set_whatever_the_order():
    rows = [row_of(sample("a", [0, 1], [5, EOS])), row_of(sample("b", [0, 1, 2], [EOS], "c", 0))]
    forward, backward = Figures(), Figures()
    for row in rows:
        forward.add(row)
    for row in reversed(rows):
        backward.add(row)
    assert forward.to_dict() == backward.to_dict()
    assert forward.to_dict() == {"rows": 2, "conversation_rows": 1, "prompt_tokens": 5, "generated_tokens": 3,
                                 "loss_mask_ones": 3, "max_row_tokens": 4, "rows_without_generated_tokens": 0,
                                 "ids_sha256": ids_digest(["b", "a"])}
    assert ids_digest(["a", "b"]) != ids_digest(["a", "c"])


# -- the text form ---------------------------------------------------------------------------------

def test_the_answer_is_split_at_think_end_without_its_stop_token(chat):
    reasoning, answer = chat.tok.encode("Some thought.", add_special_tokens=False), \
        chat.tok.encode(" The answer.", add_special_tokens=False)
    row = row_of(sample("a", [0, 11, THINK_START], reasoning + [THINK_END] + answer + [EOS]))
    decode = chat.tok.decode
    assert answer_message(row, spec(chat), decode) == {"role": "assistant", "content": "The answer.",
                                                       "reasoning_content": "Some thought."}
    # a model that opened its reasoning itself: its think-start is not part of the reasoning
    row = row_of(sample("b", [0, 11], [THINK_START] + reasoning + [THINK_END] + answer + [EOS]))
    assert answer_message(row, spec(chat, "output"), decode)["reasoning_content"] == "Some thought."
    # no think-end: the whole output is the answer
    row = row_of(sample("c", [0, 11], answer))
    assert answer_message(row, spec(chat), decode) == {"role": "assistant", "content": "The answer."}


# -- exports of a run ------------------------------------------------------------------------------

@pytest.fixture
def run(client, tmp_path, chat):
    """A run of two shards: single prompts p0-p3 (p3 dead-lettered since), a two-turn
    conversation c (turn 1's prompt holds turn 0's prompt and answer), and p0 stored twice."""
    think = chat.tok.encode("Hmm.", add_special_tokens=False)
    prompts = {f"p{i}": chat.render_one([{"role": "user", "content": f"Question {i}?"}]) for i in range(4)}
    outputs = {pid: think + [THINK_END] + chat.tok.encode(f" Answer {pid}.", add_special_tokens=False) + [EOS]
               for pid in prompts}
    turn0 = chat.render_one([{"role": "user", "content": "Hello"}])
    answer0 = think + [THINK_END] + chat.tok.encode(" Hi.", add_special_tokens=False) + [EOS]
    turn1 = chat.render_one([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                             {"role": "user", "content": "And then?"}])
    rows = [sample(pid, prompts[pid], outputs[pid]) for pid in prompts]
    rows += [sample("c#0", turn0, answer0, "c", 0), sample("c#1", turn1, think + [THINK_END, EOS], "c", 1)]
    ledger = Ledger(client, RUN)
    ledger.enqueue({r.id: pack_ids(r.input_ids[:r.prompt_len]) for r in rows}, 1)
    out = tmp_path / "shards"
    (out / RUN).mkdir(parents=True)
    for name, part in (("part-a.parquet", rows[:3]), ("part-b.parquet", rows[3:] + rows[:1])):
        pq.write_table(samples_to_table(part), out / RUN / name)
        for r in part:
            if r.id != "p3":
                ledger.mark_done(r.id, 2, out / RUN / name)
    DeadLetters(client, RUN).put(DeadLetter(id="p3", run=RUN, reason="aborted", message="m", attempts=1,
                                            servers=[], worker="w", prompt_b64="", prompt_tokens=2, sampling={}))
    return str(out), {r.id: r for r in rows if r.id != "p3"}


def test_each_format_holds_the_parquet_exports_rows_with_the_same_figures(client, run, chat, tmp_path):
    output_dir, stored = run
    # When the run is exported in each format
    manifests = {name: export_run(spec(chat), client, output_dir, tmp_path / name, format=name)
                 for name in ("parquet", "specforge", "speculators", "text")}
    # Then each trainer's file holds each done id once, ids and masks exact
    for name in ("specforge", "speculators"):
        got = {r["id"]: r for r in records(tmp_path / name, f"{name}.jsonl")}
        assert sorted(got) == sorted(stored)
        for pid, s in stored.items():
            assert got[pid]["input_ids"] == s.input_ids
            assert got[pid]["loss_mask"] == [0] * s.prompt_len + [1] * s.output_len
    # And the figures agree across formats and with the rows
    figures = {name: {k: v for k, v in m["format"].items() if k != "name"} for name, m in manifests.items()}
    assert all(f == figures["parquet"] for f in figures.values())
    assert figures["parquet"]["rows"] == manifests["parquet"]["rows"] == len(stored)
    assert figures["parquet"]["ids_sha256"] == ids_digest(stored)
    assert figures["parquet"]["prompt_tokens"] == sum(s.prompt_len for s in stored.values())
    assert figures["parquet"]["generated_tokens"] == sum(s.output_len for s in stored.values())
    assert figures["parquet"]["conversation_rows"] == 2
    # And each manifest names the one file the format wrote, with its rows
    assert manifests["specforge"]["files"][0]["name"] == "specforge.jsonl"
    assert sorted(p.name for p in (tmp_path / "specforge").iterdir()) == ["README.md", "manifest.json", "specforge.jsonl"]


def test_a_conversation_turn_is_its_own_row_supervising_only_its_answer(client, run, chat, tmp_path):
    output_dir, stored = run
    export_run(spec(chat), client, output_dir, tmp_path / "sf", format="specforge")
    got = {r["id"]: r for r in records(tmp_path / "sf", "specforge.jsonl")}
    turn1 = stored["c#1"]
    # the history (turn 0's question and answer, as the template renders it) is context, masked 0
    assert got["c#1"]["loss_mask"].index(1) == turn1.prompt_len
    assert sum(got["c#1"]["loss_mask"]) == turn1.output_len
    text = {r["id"]: r for r in records(export_dir(client, output_dir, chat, tmp_path / "t"), "messages.jsonl")}
    assert (text["c#1"]["conversation"], text["c#1"]["turn"]) == ("c", 1)
    assert "Hello" in text["c#1"]["prompt"] and "And then?" in text["c#1"]["prompt"]


def export_dir(client, output_dir, chat, dest: Path, **options) -> Path:
    export_run(spec(chat), client, output_dir, dest, format="text", format_options=options)
    return dest


def test_the_text_form_holds_the_given_messages_then_the_decoded_answer(client, run, chat, tmp_path):
    output_dir, stored = run
    given = tmp_path / "prompts.jsonl"
    given.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]})
                             + "\n" for i in range(4)))
    rows = {r["id"]: r for r in records(export_dir(client, output_dir, chat, tmp_path / "t", prompts=[given]),
                                        "messages.jsonl")}
    assert rows["p1"]["messages"] == [{"role": "user", "content": "Question 1?"},
                                      {"role": "assistant", "content": "Answer p1.", "reasoning_content": "Hmm."}]
    assert rows["p1"]["prompt"] == chat.tok.decode(stored["p1"].input_ids[:stored["p1"].prompt_len])
    assert rows["p1"]["prompt"].endswith("<think>")
    # a conversation turn's history is in its prompt; its messages are its answer alone
    assert rows["c#0"]["messages"] == [{"role": "assistant", "content": "Hi.", "reasoning_content": "Hmm."}]


def test_a_tokenizer_other_than_the_runs_is_refused_and_dest_left_alone(client, run, chat, tmp_path):
    output_dir, _ = run
    export_run(spec(chat), client, output_dir, tmp_path / "t", format="specforge")
    before = (tmp_path / "t" / "specforge.jsonl").read_bytes()
    other = RunSpec(**{**spec(chat).__dict__, "tokenizer_fingerprint": "another"})
    with pytest.raises(FormatRefused):
        export_run(other, client, output_dir, tmp_path / "t", format="text")
    assert (tmp_path / "t" / "specforge.jsonl").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".t.export-")]


def test_a_format_export_replaces_an_earlier_export_of_another_format(client, run, chat, tmp_path):
    output_dir, stored = run
    dest = tmp_path / "dest"
    export_run(spec(chat), client, output_dir, dest, format="parquet")
    export_run(spec(chat), client, output_dir, dest, format="speculators")
    assert sorted(p.name for p in dest.iterdir()) == ["README.md", "manifest.json", "speculators.jsonl"]
    export_run(spec(chat), client, output_dir, dest, format="parquet")
    assert not (dest / "speculators.jsonl").exists()
    assert json.loads((dest / "manifest.json").read_text())["format"]["rows"] == len(stored)
