"""Specification: a pipeline of the fleet's own clients sends its scripts as plain EVALSHA, with no
SCRIPT EXISTS round trip first, and still finds them on a server that lost its scripts
(`contract/redis_link/scripts.py`, `contract/redis_link/connections.py`). A real redis-server."""
from __future__ import annotations

import redis

from contract.redis_link.connections import client_for
from contract.redis_link.retries import shared
from contract.redis_link.scripts import Lua

ADD = Lua("return redis.call('INCRBY', KEYS[1], a.by)", head=("by",))


def _calls(client: redis.Redis, name: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def _pipelined_add(fleet: redis.Redis, by: int) -> list:
    with fleet.pipeline(transaction=False) as pipe:
        ADD(fleet, ["n"], {"by": by}, pipe=pipe)
        pipe.get("n")
        return pipe.execute()


def test_a_fleet_client_pipeline_sends_evalsha_without_asking_script_exists(server, client):
    # Given a fleet client on the server
    fleet = client_for(server, retry=shared())
    _pipelined_add(fleet, 1)
    client.config_resetstat()

    # When three pipelines run a script
    for by in (1, 2, 3):
        _pipelined_add(fleet, by)

    # Then each was one round trip: the script ran three times, and Redis was never asked first
    assert int(client.get("n")) == 7
    assert _calls(client, "evalsha") == 3 and _calls(client, "script|exists") == 0


def test_a_server_that_lost_its_scripts_has_them_again_when_the_fleet_client_reconnects(server, client):
    # Given a fleet client that ran a script in a pipeline
    fleet = client_for(server, retry=shared())
    assert _pipelined_add(fleet, 5)[0] == 5

    # When the server forgets every script (as a restarted or promoted one has none) and drops
    # the client's connections (as a restart or a failover does)
    client.script_flush()
    client.client_kill_filter(_type="normal", skipme=True)

    # Then the next pipeline reconnects, finds its script loaded, and runs it
    assert _pipelined_add(fleet, 2) == [7, b"7"]


def test_a_plain_redis_py_client_keeps_redis_pys_own_way(server, client):
    # Given a client built without the fleet's pools
    client.config_resetstat()

    # When it runs a script in a pipeline
    _pipelined_add(client, 4)

    # Then redis-py asked SCRIPT EXISTS first, as it does
    assert int(client.get("n")) == 4 and _calls(client, "script|exists") == 1
