"""Where shards live: `OUTPUT_DIR` parsed once, and every read and write of a shard through it.

The part owns the shard columns and the `Sample` record (`schema`), where a run's shards are
(`shard_home`), the one fsync (`durable`), and the stores (`local`, `s3`). It may import the
Redis link and the top modules (`keys`, `names`); never the broker, the ledger, the run or chat.

`OUTPUT_DIR` is a folder (a plain path or `file:///path`: `LocalStore`) or
`s3://bucket/prefix` (`S3Store`, any S3-compatible store through the standard
AWS configuration). Any other `scheme://` value, or `s3:` without a bucket, is
refused by `parse` with a message naming the value and the forms that work, so
no command ever takes `s3:/traces/runs` (or `gs://...`) for a local folder
named `s3:`. Credentials never come from `OUTPUT_DIR` (a URL with `user@` is
refused): they come from the AWS environment, so the value is safe to log.

A store offers the same few operations whatever it is, and each keeps the
promise the shard contract rests on: `create` makes a shard under a name no
one else makes, whole or not at all, and never replaces an object
(`FileExistsError` instead); `shards` lists a run's shards (names by
`contract.storage.schema.is_shard`) in name order; `source` gives one shard to pyarrow
and `stream` its bytes, one shard at a time, so no reader copies a run.
Storage trouble is an `OSError` (`FileNotFoundError` for a missing shard,
`PermissionError` for refused credentials), which the shard writer holds as
an outage; `preflight` says, before a worker starts, why it cannot write.
"""
from __future__ import annotations

from functools import lru_cache
from typing import BinaryIO, Callable, Protocol
from urllib.parse import urlsplit

SUPPORTED = "a folder (a path, or file:///path) or s3://bucket/prefix"


class UnsupportedOutput(ValueError):
    """OUTPUT_DIR names a place the fleet cannot write shards to."""


class Store(Protocol):
    def where(self, run: str) -> str: ...
    def location(self, run: str, name: str) -> str: ...
    def create(self, run: str, name: str, write: Callable[[BinaryIO], None]) -> str: ...
    def probe(self, run: str) -> None: ...
    def shards(self, run: str) -> list[str]: ...
    def sizes(self, run: str) -> dict[str, int]: ...
    def source(self, location: str): ...
    def stream(self, location: str) -> BinaryIO: ...
    def preflight(self) -> None: ...


def parse(output_dir: str, setting: str = "OUTPUT_DIR") -> tuple[str, str, str]:
    """(scheme, bucket, prefix) of an object store, or ("file", "", path) of a folder.
    Raises `UnsupportedOutput` (naming `setting`) for anything else."""
    value = str(output_dir).strip()
    if not value:
        raise UnsupportedOutput(f"{setting} is empty; it must be {SUPPORTED}")
    head, colon, _ = value.partition(":")
    if not colon or "/" in head or len(head) == 1:  # a path (a Windows drive letter included)
        return "file", "", value
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme == "file" and not parts.netloc:
        return "file", "", parts.path or "/"
    if scheme == "s3" and value.lower().startswith("s3://") and parts.hostname and "@" not in parts.netloc:
        if parts.port is not None or parts.query or parts.fragment:
            raise UnsupportedOutput(f"{setting}={_shown(value)} has a port, query or fragment; it must be {SUPPORTED} "
                                    f"(an S3-compatible endpoint goes in AWS_ENDPOINT_URL)")
        return "s3", parts.hostname, parts.path.strip("/")
    if "@" in parts.netloc:
        why = "credentials go in the AWS environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...), never in OUTPUT_DIR"
    elif scheme == "s3":
        why = "an S3 location names its bucket after two slashes"
    else:
        why = f"scheme {scheme + ':'!r} is not supported"
    raise UnsupportedOutput(f"{setting}={_shown(value)}: {why}; it must be {SUPPORTED}")


def _shown(value: str) -> str:
    """The value for a message, with anything before an `@` (a would-be credential) hidden."""
    scheme, sep, rest = value.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return value


def check(output_dir: str) -> str:
    """The value, once `parse` accepts it (a settings validator: every command refuses a bad one)."""
    parse(output_dir)
    return output_dir


@lru_cache(maxsize=8)
def store_for(output_dir: str, timeout: float | None = None) -> Store:
    """The store `OUTPUT_DIR` names (one per value: an S3 client is made once and shared by
    threads). `timeout`: the longest one call may take (connection, answer and retries
    together), so a sample's wait for its shard stays bounded."""
    scheme, bucket, path = parse(output_dir)
    if scheme == "file":
        from contract.storage.local import LocalStore

        return LocalStore(path)
    from contract.storage.s3 import S3Store

    return S3Store(bucket, path, timeout)
