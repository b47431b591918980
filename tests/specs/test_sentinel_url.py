"""`REDIS_URL=sentinel://...`: read as kombu reads it, and given to every client the same way."""
from __future__ import annotations

import pytest
from kombu import Connection

from contract.broker.config import broker_url, celery_app
from contract.redis_link.connections import (DEFAULT_MASTER, MASTER_ENV, SentinelURL, is_sentinel, kombu_sentinel_url,
                                               parse_sentinel_url, redis_for)

THREE = "sentinel://h1:26379;sentinel://h2:26380;sentinel://h3:26381/0"


def test_the_documented_form_names_three_sentinels_and_database_0():
    assert parse_sentinel_url(THREE) == SentinelURL((("h1", 26379), ("h2", 26380), ("h3", 26381)), 0)


def test_a_password_in_a_part_is_the_masters_and_the_port_defaults_to_26379():
    parts = parse_sentinel_url("sentinel://:p%40ss@h1;sentinel://:p%40ss@h2/3")
    assert parts == SentinelURL((("h1", 26379), ("h2", 26379)), 3, None, "p@ss")
    assert parse_sentinel_url("sentinel://fleet:pw@h1:1/2").username == "fleet"


@pytest.mark.parametrize("url", ["redis://h1:6379/0", "sentinel://h1;redis://h2", "sentinel://h1/zero", ";"])
def test_anything_else_is_refused_without_naming_a_secret(url):
    with pytest.raises(ValueError) as refused:
        parse_sentinel_url(url)
    assert "pw" not in str(refused.value)


def test_kombu_gets_the_database_and_password_in_the_part_it_reads():
    # Given a URL whose database and password sit on its last part (kombu reads only the first)
    url = "sentinel://h1:26379;sentinel://:pw@h2:26379/3"

    # When it becomes the broker's URL
    broker, options = broker_url(url)

    # Then kombu connects to the same database, with the same password, through every Sentinel
    connection = Connection(broker)
    assert (connection.virtual_host, connection.password) == ("3", "pw")
    assert [part.split("@")[-1] for part in connection.alt] == ["h1:26379/3", "h2:26379/3"]
    assert options["master_name"] == DEFAULT_MASTER and options["socket_timeout"] > 0
    assert kombu_sentinel_url(broker) == broker  # stable


def test_the_master_name_comes_from_FLEET_SENTINEL_MASTER(monkeypatch):
    monkeypatch.setenv(MASTER_ENV, "fleet-redis")
    assert broker_url(THREE)[1]["master_name"] == "fleet-redis"
    client = redis_for(THREE)
    assert client.connection_pool.service_name == "fleet-redis"
    redis_for.cache_clear()


def test_a_plain_url_is_left_as_it_is_and_every_broker_retries_channel_errors():
    assert not is_sentinel("redis://h:6379/0")
    assert broker_url("redis://h:6379/0")[0] == "redis://h:6379/0"
    app = celery_app(THREE)
    assert app.conf.broker_channel_error_retry is True
    assert app.conf.broker_transport_options["master_name"] == DEFAULT_MASTER
    assert app.conf.broker_transport_options["socket_keepalive"] is True
