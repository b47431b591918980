"""The one real part the fast layer uses: a redis-server, started once per module (under a second)."""
from __future__ import annotations

import pytest
import redis

from producer.local import start_redis


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    process.stop()


@pytest.fixture
def client(server):
    """A client of that server, on an empty database."""
    client = redis.Redis.from_url(server)
    client.flushdb()
    return client
