"""A worker refuses to start when `OUTPUT_DIR` cannot take shards at all.

A bucket that does not exist, credentials the store refuses, or a store that
cannot be reached would otherwise show only after the first generations, as a
worker holding every sample it makes. So before `celery worker` consumes
anything, the store's `preflight` writes and deletes a probe object and any
failure ends the start with one line that names the fix (never a credential).
A folder is not checked: a full or missing disk at start is held like any
outage, as it always was. Other `celery -A workers` commands (inspect, flower)
skip the check.
"""
from __future__ import annotations

from celery import signals

from contract.storage import store_for
from contract.storage.refused import StorageRefused


def _running_worker() -> bool:
    import click

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command.name == "worker"


@signals.import_modules.connect
def _check_storage(sender=None, **_) -> None:
    if not _running_worker() or sender is None or not hasattr(sender, "fleet_settings"):
        return
    try:
        settings = sender.fleet_settings  # the store the shard writer will use, with its bounds
        store_for(settings.output_dir, settings.shard_commit_timeout).preflight()
    except StorageRefused as exc:
        raise SystemExit(f"worker refused to start: {exc}") from None
