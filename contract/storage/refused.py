"""A store the worker cannot use at all: the one error `preflight` raises for it."""
from __future__ import annotations


class StorageRefused(Exception):
    """A store the worker cannot use at all (wrong credentials, no such bucket, unreachable):
    the worker refuses to start rather than hold every sample it generates."""
