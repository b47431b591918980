"""Where shards live: which OUTPUT_DIR values are served, how S3's answers read, what a store promises.

In process: the parsing and the error mapping are pure; the folder store is
exercised on a temporary folder (the bucket store runs against moto's server
in tests/test_s3_output.py).
"""
from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from pydantic import ValidationError

from contract.settings import SharedSettings, settings_refusal
from contract.storage import UnsupportedOutput, parse, store_for
from contract.storage.local import LocalStore
from contract.storage.s3 import S3Store, as_os_error


@pytest.mark.parametrize("value, parsed", [
    ("./shards", ("file", "", "./shards")),
    ("/data/shards", ("file", "", "/data/shards")),
    ("file:///data/shards", ("file", "", "/data/shards")),
    ("s3://traces/runs", ("s3", "traces", "runs")),
    ("s3://traces/runs/", ("s3", "traces", "runs")),
    ("s3://traces", ("s3", "traces", "")),
])
def test_a_folder_or_an_s3_bucket_is_where_shards_go(value, parsed):
    assert parse(value) == parsed


@pytest.mark.parametrize("value, why", [
    ("s3:/traces/runs", "bucket after two slashes"),
    ("s3:traces/runs", "bucket after two slashes"),
    ("s3://", "bucket after two slashes"),
    ("gs://traces/runs", "scheme 'gs:' is not supported"),
    ("http://minio:9000/traces", "scheme 'http:' is not supported"),
    ("s3://traces:9000/runs", "AWS_ENDPOINT_URL"),
    ("", "empty"),
])
def test_any_other_form_is_refused_naming_the_value_and_the_forms_that_work(value, why):
    with pytest.raises(UnsupportedOutput) as refused:
        parse(value)
    assert why in str(refused.value) and "s3://bucket/prefix" in str(refused.value)


def test_a_credential_in_the_url_is_refused_and_never_shown():
    with pytest.raises(UnsupportedOutput) as refused:
        parse("s3://AKIAEXAMPLE:hunter2@traces/runs")
    assert "hunter2" not in str(refused.value) and "AKIAEXAMPLE" not in str(refused.value)
    assert "AWS_ACCESS_KEY_ID" in str(refused.value)


def test_every_command_refuses_through_the_shared_settings():
    with pytest.raises(ValidationError) as refused:
        SharedSettings(output_dir="gs://traces/runs")
    line = settings_refusal(refused.value)
    assert "gs://traces/runs" in line and "\n" not in line


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


@pytest.mark.parametrize("error, kind", [
    (_client_error(412, "PreconditionFailed"), FileExistsError),
    (_client_error(404, "NoSuchKey"), FileNotFoundError),
    (_client_error(403, "InvalidAccessKeyId"), PermissionError),
    (_client_error(403, "AccessDenied"), PermissionError),
    (_client_error(503, "SlowDown"), OSError),
    (_client_error(500, "InternalError"), OSError),
    (_client_error(409, "ConditionalRequestConflict"), OSError),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), OSError),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), OSError),
])
def test_every_s3_failure_is_an_os_error_so_the_writer_holds_its_samples(error, kind):
    mapped = as_os_error(error, "upload", "runs/r/part-x.parquet")
    assert type(mapped) is kind and "runs/r/part-x.parquet" in str(mapped)


def test_throttling_and_outages_are_not_taken_for_a_taken_name():
    for status, code in ((503, "SlowDown"), (500, "InternalError")):
        assert not isinstance(as_os_error(_client_error(status, code), "upload", "k"), FileExistsError)


def test_an_object_name_is_the_prefix_the_run_and_the_shard():
    store = S3Store("traces", "runs/2026")
    assert store.location("r", "part-a.parquet") == "s3://traces/runs/2026/r/part-a.parquet"
    assert store.where("r") == "s3://traces/runs/2026/r/"
    assert S3Store("traces", "").location("r", "part-a.parquet") == "s3://traces/r/part-a.parquet"


def test_a_folder_store_never_replaces_a_shard_and_lists_only_final_names(tmp_path):
    store = store_for(str(tmp_path))
    assert isinstance(store, LocalStore)
    first = store.create("r", "part-a.parquet", lambda sink: sink.write(b"first"))
    with pytest.raises(FileExistsError):
        store.create("r", "part-a.parquet", lambda sink: sink.write(b"second"))
    (tmp_path / "r" / ".tmp-part-b.parquet").write_bytes(b"partial")
    store.probe("r")
    assert store.shards("r") == [first]
    assert store.stream(first).read() == b"first"


def test_an_outage_message_never_shows_a_password_in_the_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:hunter2@127.0.0.1:1")
    error = EndpointConnectionError(endpoint_url="http://minio:hunter2@127.0.0.1:1/traces")
    mapped = as_os_error(error, "upload", "k")
    assert "hunter2" not in str(mapped) and "127.0.0.1:1" in str(mapped)
