"""What the fleet-size parts share: the simulated run, its fleet's state, and Redis's own counters.

`fleet_size` fills a fleet of simulated workers and measures their periodic
work; `fleet_nodes` sends their samples at node rate. Both read Redis's CPU and
command counts here, and copy the run's real message for each simulated prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import redis

RUN = "fleet"
EVENTS = "/0.celeryev"  # kombu's fanout channel prefix for Celery's event exchange (Flower's subscription)


@dataclass
class FleetState:
    holding: dict[str, list[str]]      # worker -> prompt ids
    tags: dict[str, list[str]]         # worker -> its delivery tags
    lost: list[str]
    queue: str
    message_bytes: int
    template: dict                     # the run's real message, which every simulated one copies
    ids: bytes                         # the packed token ids every simulated prompt has
    holders: dict                      # worker -> its lease holder (`contract.broker.worker_lease`)


def message_for(template: dict, prompt_id: str, tag: str) -> dict:
    """The run's real message, for another prompt under another delivery tag."""
    message = json.loads(json.dumps(template))
    message["headers"]["id"] = message["headers"]["root_id"] = f"{RUN}:{prompt_id}"
    message["properties"]["delivery_tag"] = tag
    return message


# --- Redis's own counters ------------------------------------------------------------------

OWN = ("cmdstat_info", "cmdstat_config", "cmdstat_slowlog", "cmdstat_client")  # the bench's readings


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_calls(client: redis.Redis) -> int:
    return sum(v["calls"] for k, v in client.info("commandstats").items() if not k.startswith(OWN))


def redis_by_command(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Command name -> (calls, microseconds of Redis's own time in it), the bench's readings left out."""
    return {k[len("cmdstat_"):]: (int(v["calls"]), int(v["usec"])) for k, v in client.info("commandstats").items()
            if not k.startswith(OWN)}


def per_sample(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], samples: int) -> dict:
    """Per command sent between two `by_command` readings, per sample: calls, and Redis's own time in it."""
    return {name: {"calls": round((n - before.get(name, (0, 0))[0]) / samples, 3),
                   "us": round((us - before.get(name, (0, 0))[1]) / samples, 2)}
            for name, (n, us) in sorted(after.items(), key=lambda kv: -kv[1][1]) if n > before.get(name, (0, 0))[0]}
