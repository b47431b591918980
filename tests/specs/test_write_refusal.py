"""Redis refusing writes is recognised in one place (`contract/redis_link/write_refusal.py`).

Given redis-py's own exceptions for the three refusals, the same replies
wrapped by kombu or Celery (raised from them, or only their text), and a
pipeline's error that quotes the command, then each is named with its cause
and a remedy in one line that holds no command data; any other error is not
a refusal.
"""
from __future__ import annotations

import pytest
import redis

from contract.redis_link.write_refusal import refusal
from workers.intake.redis_writes import RedisWrites

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
READONLY = redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
NOREPLICAS = redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write.")


def wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except redis.RedisError as exc:
            raise RuntimeError("kombu.exceptions.OperationalError: publish failed") from exc
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize("error, cause, words", [
    (OOM, "out of memory", ("OOM command not allowed", "raise maxmemory")),
    (READONLY, "read-only", ("READONLY You can't write", "point it at the primary")),
    (NOREPLICAS, "no replicas", ("NOREPLICAS Not enough", "min-replicas-to-write")),
])
def test_each_refusal_is_named_with_its_cause_and_remedy_however_it_is_wrapped(error, cause, words):
    for exc in (error, wrapped(error)):
        found = refusal(exc)
        assert found.cause == cause and all(w in found.line() for w in words)
        assert "\n" not in found.line()


def test_a_refusal_known_only_by_its_text_is_still_named():
    found = refusal(RuntimeError("Error while publishing: 'NOREPLICAS Not enough good replicas to write.'"))
    assert found.cause == "no replicas" and found.reply == "NOREPLICAS Not enough good replicas to write."


def test_a_pipelines_refusal_drops_the_command_and_its_data():
    exc = redis.exceptions.OutOfMemoryError(
        "Command # 1 (SET fleet:worker:w1 {\"secret\": 1}) of pipeline caused error: command not allowed")
    line = refusal(exc).line()
    assert "OOM command not allowed" in line and "secret" not in line


@pytest.mark.parametrize("exc", [redis.exceptions.ConnectionError("refused"), ValueError("x"),
                                 redis.exceptions.ResponseError("WRONGTYPE Operation against a key")])
def test_other_errors_are_not_refusals(exc):
    assert refusal(exc) is None


def test_a_worker_notes_a_refusal_once_and_its_end_at_the_next_accepted_write(caplog):
    writes = RedisWrites()
    assert writes.failed(OOM) and writes.failed(OOM)
    assert not writes.failed(ValueError("not Redis"))
    assert writes.refused.cause == "out of memory"
    writes.accepted()
    assert writes.refused is None
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
