"""The settings both sides read: where Redis is, where shards go, the queue prefix.

Built once at an entry point (a CLI command, the worker's Celery app) and
passed in; nothing reads them at import. The worker's own tuning extends this
class in `workers/settings.py`.
"""
from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .keys import DEFAULT_QUEUE


class SharedSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_", frozen=True, populate_by_name=True)

    redis_url: str = Field("redis://localhost:6379/0", validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    output_dir: str = Field("./shards", validation_alias=AliasChoices("OUTPUT_DIR", "output_dir"))
    queue_prefix: str = DEFAULT_QUEUE
