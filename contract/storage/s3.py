"""Shards as objects in an S3 bucket (or any S3-compatible store): created once, never replaced.

S3 has no rename, no hard link and no fsync, so the commit is one request: the
shard is encoded in memory and uploaded as one object with `If-None-Match: *`
(create only). S3 never shows a partial object (a PUT lands whole or not at
all), and a name that exists already answers 412, which is `FileExistsError`
here, never a replacement. A shard past what one PUT may carry goes up in
parts, and any failure aborts the upload instead of completing it (pyarrow's
S3 writer completes it even when the writer raised, apache/arrow#40502, which
is why it is not used for writing). Names are unique by construction
(`workers/output/shards.py`), so the condition only ever fires for a bug or a clash.

Credentials, region and endpoint are boto3's standard chain (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, `AWS_REGION`,
`AWS_ENDPOINT_URL` for MinIO and the like); nothing here logs or returns them.
Every failure is an `OSError` (`_as_os_error`), so the shard writer holds its
samples through an outage, throttling (503 SlowDown) or a 5xx exactly as
through a full disk; one call (connection, answer and botocore's own retry
together) is bounded by the timeout given, so a sample's wait stays bounded.
"""
from __future__ import annotations

import io
import os
import secrets
from pathlib import PurePosixPath
from typing import BinaryIO, Callable

import boto3
import pyarrow as pa
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from contract.redis_link.connections import redact_text
from contract.storage.schema import is_shard

from contract.storage.refused import StorageRefused

SINGLE_PUT_MAX = 5 * 2**30 - 2**20  # S3 refuses one PUT above 5 GiB
PART_BYTES = 256 * 2**20
ATTEMPTS = 2  # botocore's standard retry (throttling and 5xx backoff included); the writer retries after
NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
REFUSED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
           "InvalidToken", "AllAccessDisabled", "AccountProblem"}


class S3Store:
    def __init__(self, bucket: str, prefix: str, timeout: float | None = None):
        self.bucket, self.prefix = bucket, prefix
        self.single_put_max, self.part_bytes = SINGLE_PUT_MAX, PART_BYTES
        self.client = _client(timeout)

    # -- names --------------------------------------------------------------------------

    def where(self, run: str) -> str:
        return f"s3://{self.bucket}/{self._key(run, '')}"

    def location(self, run: str, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(run, name)}"

    def _key(self, run: str, name: str) -> str:
        return "/".join(part for part in (self.prefix, run) if part) + "/" + name if (self.prefix or run) else name

    def _key_of(self, location: str) -> str:
        head = f"s3://{self.bucket}/"
        if not location.startswith(head):
            raise ValueError(f"{location} is not in bucket {self.bucket}")
        return location[len(head):]

    # -- writing --------------------------------------------------------------------------

    def create(self, run: str, name: str, write: Callable[[BinaryIO], None]) -> str:
        buffer = io.BytesIO()
        write(buffer)
        body = buffer.getbuffer()
        key = self._key(run, name)
        if len(body) <= self.single_put_max:
            _call("upload", key, lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=bytes(body),
                                                                IfNoneMatch="*"))
        else:
            self._multipart(key, body)
        return self.location(run, name)

    def _multipart(self, key: str, body: memoryview) -> None:
        """Parts, then a create-only completion; any failure aborts (never completes) the upload."""
        upload = _call("upload", key, lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key))
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, len(body), self.part_bytes), start=1):
                chunk = bytes(body[start:start + self.part_bytes])
                done = _call("upload", key, lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk))
                parts.append({"PartNumber": number, "ETag": done["ETag"]})
            _call("upload", key, lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, IfNoneMatch="*"))
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception:  # storage failing: the bucket's AbortIncompleteMultipartUpload rule collects it
                pass
            raise

    def probe(self, run: str) -> None:
        """A small object created and deleted where shards go: the store takes writes again."""
        key = self._key(run, f".probe-{secrets.token_hex(6)}")
        _call("probe", key, lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=b"probe",
                                                           IfNoneMatch="*"))
        _call("probe", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))

    def preflight(self) -> None:
        """Refuse to start when the bucket cannot be reached or written (a probe object)."""
        try:
            self.probe("")
        except OSError as exc:
            raise StorageRefused(f"OUTPUT_DIR={self.where('').rstrip('/')} cannot be written: {str(exc).rstrip('.')}. "
                                 f"{_advice(exc)}") from None

    def replace(self, key: str, body: bytes, content_type: str) -> None:
        """One object that is meant to be replaced whole (an export's manifest: one PUT, so a
        reader sees the old one or the new one). Never used for a shard."""
        _call("upload", key, lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                                            ContentType=content_type))

    def delete(self, key: str) -> None:
        _call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=key))

    # -- reading --------------------------------------------------------------------------

    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (all levels), in order."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in _call("list", prefix, lambda: list(pages))
                      for item in page.get("Contents", ()))

    def sizes(self, run: str) -> dict[str, int]:
        """Each shard object of the run (its location) and its size, in name order."""
        prefix = self._key(run, "")
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                        Delimiter="/")
        found: dict[str, int] = {}
        for page in _call("list", prefix, lambda: list(pages)):
            for item in page.get("Contents", ()):
                if is_shard(PurePosixPath(item["Key"])):
                    found[f"s3://{self.bucket}/{item['Key']}"] = item["Size"]
        return dict(sorted(found.items()))

    def shards(self, run: str) -> list[str]:
        return list(self.sizes(run))

    def source(self, location: str) -> pa.BufferReader:
        """The shard, read into memory (one object at a time: a reader never holds a run)."""
        return pa.BufferReader(self.stream(location).read())

    def stream(self, location: str) -> BinaryIO:
        key = self._key_of(location)
        return _Body(_call("read", key, lambda: self.client.get_object(Bucket=self.bucket, Key=key))["Body"], key)


class _Body(io.RawIOBase):
    """An object's bytes as they arrive; a failure on the way is an `OSError`, like the others."""

    def __init__(self, body, key: str):
        self.body, self.key = body, key

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return _call("read", self.key, lambda: self.body.read(None if size is None or size < 0 else size))

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.body.close()
        super().close()


def _client(timeout: float | None):
    """boto3's standard chain, with every call bounded: connect and read each a quarter of
    `timeout` (at most 5 s and 60 s), two attempts."""
    total = timeout or 240.0
    config = Config(connect_timeout=min(5.0, total / 4), read_timeout=min(60.0, total / 4),
                    retries={"total_max_attempts": ATTEMPTS, "mode": "standard"})
    session = boto3.session.Session(region_name=os.environ.get("AWS_REGION") or None)
    return session.client("s3", config=config)


def _call(what: str, key: str, request: Callable):
    try:
        return request()
    except (ClientError, BotoCoreError) as exc:
        raise as_os_error(exc, what, key) from None


def as_os_error(exc: Exception, what: str, key: str) -> OSError:
    """An S3 failure as the `OSError` the fleet handles: 412 is `FileExistsError` (a name
    taken: never replaced), a missing object `FileNotFoundError`, refused credentials
    `PermissionError`, and anything else (refused connection, timeout, 5xx, 503 SlowDown)
    a plain `OSError`: an outage the writer waits out."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        line = f"S3 {what} of {key}: {code or status} {error.get('Message', '')}".rstrip()
        if status == 412 or code == "PreconditionFailed":
            return FileExistsError(line)
        if code in NOT_FOUND:
            return FileNotFoundError(line)
        if code in REFUSED or status == 403:
            return PermissionError(line)
        return OSError(line)
    name = type(exc).__name__
    text = redact_text(str(exc), os.environ.get("AWS_ENDPOINT_URL", ""))  # an endpoint may carry user:pass@
    if name in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError"):
        return PermissionError(f"S3 {what} of {key}: {text}")
    return OSError(f"S3 {what} of {key}: {name}: {text}")


def _advice(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return ("Check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and that they "
                "may write to the bucket")
    if "NoSuchBucket" in str(exc):
        return "Create the bucket, or fix the bucket's name in OUTPUT_DIR"
    return "Check that the store is reachable (AWS_ENDPOINT_URL for an S3-compatible store, AWS_REGION)"
