"""The settings both sides read: where Redis is, where shards go, the queue prefix.

Built once at an entry point (a CLI command, the worker's Celery app) and
passed in; nothing reads them at import. The worker's own tuning extends this
class in `workers/settings.py`.
"""
from __future__ import annotations

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .keys import DEFAULT_QUEUE
from .storage import check as check_output_dir


class SharedSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_", frozen=True, populate_by_name=True)

    redis_url: str = Field("redis://localhost:6379/0", validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    output_dir: str = Field("./shards", validation_alias=AliasChoices("OUTPUT_DIR", "output_dir"))
    queue_prefix: str = DEFAULT_QUEUE

    @field_validator("output_dir")
    @classmethod
    def _supported_output(cls, value: str) -> str:
        """A folder or s3://bucket/prefix (`contract/storage`): any other form is refused by
        every command and by the worker, never taken for a local folder named `s3:`."""
        return check_output_dir(value)


def settings_refusal(exc: ValidationError) -> str:
    """Why the environment's settings are refused, in one line that holds no value (a
    refused value the message needs is shown by its validator, credentials hidden)."""
    lines = []
    for error in exc.errors():
        where, why = ".".join(map(str, error["loc"])) or "settings", error["msg"].removeprefix("Value error, ")
        lines.append(why if why.startswith(where) else f"{where}: {why}")
    return "; ".join(lines)
