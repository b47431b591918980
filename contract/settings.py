"""The settings both sides read: where Redis is, where shards go, the queue prefix.

Built once at an entry point (a CLI command, the worker's Celery app) and
passed in; nothing reads them at import. The worker's own tuning extends this
class in `workers/settings.py`.
"""
from __future__ import annotations

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.keys import DEFAULT_QUEUE
from contract.storage import check as check_output_dir


class SharedSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_", frozen=True, populate_by_name=True)

    redis_url: str = Field("redis://localhost:6379/0", validation_alias=AliasChoices("REDIS_URL", "redis_url"),
                           description="Broker and state: `redis://` or `rediss://`, password in the URL; or the "
                           "Sentinels, `sentinel://[:PASSWORD@]h1:26379;sentinel://h2:26379;sentinel://h3:26379/0` "
                           "([Sentinel](../deploy/sentinel.md)).")
    output_dir: str = Field("./shards", validation_alias=AliasChoices("OUTPUT_DIR", "output_dir"),
                            description="Where shards go: a folder (a path, or `file:///path`) or "
                            "`s3://bucket/prefix` ([S3](../deploy/s3.md)); any other form is refused.")
    queue_prefix: str = Field(DEFAULT_QUEUE, description="The Celery queue prompts are published to (a run "
                              "enqueued with `--served-model M` goes to `PREFIX@M`).")

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
