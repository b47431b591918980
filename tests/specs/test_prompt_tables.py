"""Prompts from tables: a Parquet file and a `datasets` folder read as JSONL lines are.

Each table is a real file: Parquet written by pyarrow, and a folder written by
the `datasets` library's own `save_to_disk` (plus one laid out by hand, as
`save_to_disk` lays it out, for the reader's edge cases).
"""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from producer.prompt_tables import TableRefused, TableSource, is_table
from producer.prompts import BadLine, Columns, Prompt, read_prompts

ROWS = [
    {"id": "a", "messages": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"},
    {"id": "b", "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Name a prime."}], "answer": "2"},
]


def prompts(source) -> list:
    return list(source)


def test_a_parquet_file_gives_the_same_prompts_as_the_same_jsonl_lines(tmp_path):
    # Given the same records as a Parquet file and as JSONL lines
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    jsonl = io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in ROWS))

    # When both are read
    from_table = prompts(TableSource(tmp_path / "p.parquet"))
    from_lines = list(read_prompts(jsonl))

    # Then they hold the same ids and conversations (rows numbered from 0, lines from 1)
    assert is_table(tmp_path / "p.parquet") and not is_table(tmp_path / "p.jsonl")
    assert [(p.id, p.messages) for p in from_table] == [(p.id, p.messages) for p in from_lines]
    assert [p.line for p in from_table] == [0, 1] and [p.line for p in from_lines] == [1, 2]


def test_a_datasets_folder_saved_by_the_library_is_read_in_order_across_its_files(tmp_path):
    # Given a dataset saved with datasets' own save_to_disk, in three data files
    datasets = pytest.importorskip("datasets")
    rows = [{"id": f"q{i}", "prompt": f"question {i}", "answer": str(i)} for i in range(30)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    assert len(list((tmp_path / "ds").glob("data-*.arrow"))) == 3

    # When it is read
    source = TableSource(tmp_path / "ds")
    found = prompts(source)

    # Then every row is a prompt, in the dataset's order, each numbered by its index
    assert [p.id for p in found] == [f"q{i}" for i in range(30)]
    assert [p.line for p in found] == list(range(30))
    assert found[7].messages == [{"role": "user", "content": "question 7"}]
    # And the reading got to the end of its bytes
    assert source.position == source.size


def test_a_datasets_dict_folder_is_refused_naming_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    # Given a DatasetDict saved to disk
    split = datasets.Dataset.from_list([{"prompt": "x"}])
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dd"))

    # When it is opened, Then it is refused, naming a split's folder to pass instead
    with pytest.raises(TableRefused, match=r"DatasetDict \(train, test\).*dd/train"):
        TableSource(tmp_path / "dd")


def hand_made_folder(folder, tables: list[pa.Table]) -> None:
    """A folder as `save_to_disk` lays one out: IPC stream files listed by state.json."""
    folder.mkdir()
    names = []
    for n, table in enumerate(tables):
        name = f"data-{n:05d}-of-{len(tables):05d}.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=3):
                writer.write_batch(batch)
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_fingerprint": "f", "_split": None}))
    (folder / "dataset_info.json").write_text("{}")


def test_the_columns_options_name_the_conversation_and_the_id_whatever_the_form(tmp_path):
    # Given a folder whose conversation is ShareGPT turns in a column "chat", and ids in "uid"
    rows = [{"uid": 10 + i, "chat": [{"from": "human", "value": f"hi {i}"}], "prompt": "not this"}
            for i in range(5)]
    hand_made_folder(tmp_path / "ds", [pa.Table.from_pylist(rows)])

    # When it is read with --messages-column chat --id-column uid
    found = prompts(TableSource(tmp_path / "ds", Columns(messages="chat", id="uid")))

    # Then the named columns are read (a ShareGPT list, by its value), not the default "prompt"
    assert [p.id for p in found] == [str(10 + i) for i in range(5)]
    assert found[0].messages == [{"role": "user", "content": "hi 0"}]

    # And a prompt string in a named column is one user turn
    pq.write_table(pa.Table.from_pylist([{"question": "why?"}]), tmp_path / "q.parquet")
    (only,) = prompts(TableSource(tmp_path / "q.parquet", Columns(messages="question")))
    assert only.messages == [{"role": "user", "content": "why?"}] and only.id.startswith("p-")


def test_the_columns_options_apply_to_jsonl_lines_alike():
    # Given a JSONL line whose conversation and id are under other names
    line = b'{"key": "k1", "turns": [{"role": "user", "content": "hello"}]}\n'

    # When it is read with the same options
    (prompt,) = read_prompts(io.BytesIO(line), columns=Columns(messages="turns", id="key"))

    # Then it is the prompt a table row with those columns gives
    assert (prompt.id, prompt.messages) == ("k1", [{"role": "user", "content": "hello"}])


def test_a_table_without_the_named_columns_is_refused_whole_before_any_row(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"text": "x", "id": "1"}]), tmp_path / "t.parquet")
    # When the conversation column is neither named nor one of the defaults, Then the table is refused
    with pytest.raises(TableRefused, match="no column 'messages', 'conversations' or 'prompt'.*text"):
        TableSource(tmp_path / "t.parquet")
    # And a named column it lacks is said by name, with the columns it has
    with pytest.raises(TableRefused, match=r"no column 'msgs' \(--messages-column\); its columns: text, id"):
        TableSource(tmp_path / "t.parquet", Columns(messages="msgs"))
    with pytest.raises(TableRefused, match=r"no column 'key' \(--id-column\)"):
        TableSource(tmp_path / "t.parquet", Columns(messages="text", id="key"))
    # And a folder that is not a saved dataset, and a file that is not Parquet, are refused
    (tmp_path / "plain").mkdir()
    with pytest.raises(TableRefused, match="not a dataset saved"):
        TableSource(tmp_path / "plain")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(TableRefused, match="not a readable Parquet file"):
        TableSource(tmp_path / "bad.parquet")


def test_bad_rows_are_reported_with_their_row_numbers_and_the_others_kept(tmp_path):
    # Given a table whose rows 1, 3 and 4 are bad the way a bad JSONL line is
    rows = [
        {"id": "ok0", "messages": [{"role": "user", "content": "fine"}]},
        {"id": "bad1", "messages": []},
        {"id": "ok2", "messages": [{"role": "user", "content": "fine too"}]},
        {"id": "bad3", "messages": [{"role": "wizard", "content": "x"}]},
        {"id": "bad4", "messages": [{"role": "user", "content": None}]},
        {"id": "ok5", "messages": [{"role": "user", "content": "a\u00e9"}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")

    # When it is read
    found = prompts(TableSource(tmp_path / "t.parquet"))

    # Then each bad row is a BadLine with its index and the same reason a line would get
    bad = {b.line: b.reason for b in found if isinstance(b, BadLine)}
    assert bad == {1: "messages must be a non-empty list, not an empty array",
                   3: "message 0 has unknown role 'wizard'",
                   4: "message 0 content is not a string but null"}
    assert [p.id for p in found if isinstance(p, Prompt)] == ["ok0", "ok2", "ok5"]


def test_other_columns_become_a_lines_other_fields_as_json_values(tmp_path):
    # Given a row with an answer, a timestamp, a struct and bytes beside its prompt
    import datetime as dt

    table = pa.Table.from_pylist([{"prompt": "p", "answer": "42", "meta": {"level": 3},
                                   "at": dt.datetime(2026, 1, 2, 3, 4, 5), "blob": b"\xff\x00"}])
    pq.write_table(table, tmp_path / "t.parquet")

    # When the row is turned into a line's record
    source = TableSource(tmp_path / "t.parquet")
    (batch,) = list(source._batches())
    from producer.prompt_tables import _plain

    record = {k: _plain(v) for k, v in batch.to_pylist()[0].items()}

    # Then every value is one a JSON line could hold (a verifier reads "answer" as it would a line's)
    assert json.loads(json.dumps(record)) == {"prompt": "p", "answer": "42", "meta": {"level": 3},
                                              "at": "2026-01-02T03:04:05", "blob": "/wA="}


def test_a_large_table_is_read_in_batches_with_flat_memory(tmp_path):
    # Given a Parquet file of 40,000 prompts of 1 KB (about 40 MB of text), in row groups of 2,000
    text = "x" * 1000
    table = pa.Table.from_pydict({"id": [f"r{i}" for i in range(40_000)], "prompt": [text] * 40_000})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=2000, compression="none")
    del table

    # When it is read to the end
    source = TableSource(tmp_path / "big.parquet")
    peak, count = 0, 0
    for item in source:
        count += 1
        if count % 1000 == 0:
            peak = max(peak, pa.total_allocated_bytes())

    # Then every row came, and Arrow never held more than a few row groups (the file is 40 MB)
    assert count == 40_000 and source.position == source.size
    assert peak < 12 * 2**20, peak
