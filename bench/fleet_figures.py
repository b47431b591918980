"""The fleet-size part's projection to 100, 1,000 and 5,000 nodes, and its figures.

n nodes at `rate` samples a second each cost Redis n x (rate x a sample +
a node's periodic work a second) + the audit's rounds, which run once per
audit interval for the whole fleet, whatever n. A sample's cost is taken two
ways: at node rate (`fleet_nodes`: each node batching what `rate` lets it,
its task-event flushes in the mix), which is the regime of a big fleet and the
one judged against the goal, and from one real worker storing as fast as it
can (its takes and group commits amortized over many samples, its events
added at the cost of one PUBLISH each), which proves the real worker's path
and is shown beside.
"""
from __future__ import annotations

GOAL_CORES = 1.0  # #34 goal 6: 5,000 nodes within one Redis core


def projections(d: dict, opts, settings) -> dict:
    """Both projections from the largest fleet measured; the node-rate one is judged."""
    return {"node rate": project_node_rate(d, opts, settings), "real worker": project(d, opts, settings),
            "judged": "node rate"}


def project(d: dict, opts, settings) -> dict:
    """From the real worker's per-sample figure: its task-event flushes (at most one a
    FLEET_TASK_EVENTS_INTERVAL, fewer when it stores fewer than that many events' worth) added,
    each costing what a worker-heartbeat event's PUBLISH does."""
    flushes = min(1 / settings.task_events_interval, 3 * opts.rate)
    events = flushes * d["rounds"]["worker-heartbeat event"]["redis_us"]
    per_node_us = opts.rate * d["samples"]["redis_us_per_sample"] + d["redis_us_per_worker_s"] + events
    per_node_commands = opts.rate * d["samples"]["commands_per_sample"] + d["commands_per_worker_s"] + flushes
    return {**_fleet(per_node_us, per_node_commands, d, opts, settings), "events_us_per_s": events}


def project_node_rate(d: dict, opts, settings) -> dict:
    """From the node-rate per-sample figure (its events inside), and what the goal leaves a sample."""
    nr = d["node_rate"]
    samples_us = opts.rate * nr["redis_us_per_sample"]
    per_node_us = samples_us + d["redis_us_per_worker_s"]
    per_node_commands = opts.rate * nr["commands_per_sample"] + d["commands_per_worker_s"]
    p = _fleet(per_node_us, per_node_commands, d, opts, settings)
    most = max(opts.nodes)
    budget = ((GOAL_CORES * 1e6 - p["audit_us_per_s"]) / most - d["redis_us_per_worker_s"]) / opts.rate
    return {**p, "samples_us_per_s": samples_us, "periodic_us_per_s": d["redis_us_per_worker_s"],
            "round_trips_per_sample": nr["round_trips_per_sample"], "us_per_round_trip": nr["redis_us_per_round_trip"],
            "sample_budget_us": budget, "round_trip_budget": budget / nr["redis_us_per_round_trip"]}


def _fleet(per_node_us: float, per_node_commands: float, d: dict, opts, settings) -> dict:
    audit_us_per_s = d["audit"]["redis_ms_per_round"] * 1e3 / settings.audit_interval
    return {"per_node_us_per_s": per_node_us, "audit_us_per_s": audit_us_per_s,
            "nodes": {n: {"cores": (n * per_node_us + audit_us_per_s) / 1e6, "commands_per_s": n * per_node_commands,
                          "connections": n * d["samples"]["connections"], "in_flight": n * opts.in_flight}
                      for n in opts.nodes}}


# --- figures -------------------------------------------------------------------------------

def fleet_figures(d: dict) -> list:
    figures = []
    for n, r in d["results"].items():
        figures += _size_figures(f"9 fleet size, {n} workers", r, d.get("pinned", ""))
    return figures + _projection_figures(d["projection"], d["options"])


def _size_figures(part: str, r: dict, pinned: str) -> list:
    from .report import Figure, at_most

    s, a = r["samples"], r["audit"]
    rounds = ", ".join(f"{k} {v['redis_us']:.0f} us/{r['intervals'][k]:g} s"
                       + (" (not counted)" if k in r.get("not_counted", ()) else "")
                       for k, v in r["rounds"].items())
    return [
        *_node_rate_figures(part, r, pinned),
        Figure(part, "one real worker: Redis CPU per stored sample", s["redis_us_per_sample"], "{:.0f}", "us",
               goal="<= 150 (#34 point 4)", met=at_most(s["redis_us_per_sample"], 150),
               note=f"a real worker, {s['samples']} short answers on an instant stand-in as fast as it stores "
                    f"them (its takes and group commits shared by many samples), beside {r['in_flight']:,} "
                    f"simulated prompts in flight; {pinned}"),
        Figure(part, "one real worker: Redis commands per stored sample", s["commands_per_sample"], "{:.1f}",
               goal="<= 9 (#34 point 4)", met=at_most(s["commands_per_sample"], 9),
               note="INFO commandstats, a script's own commands counted: " + _commands(s.get("by_command", {}))),
        Figure(part, "Redis CPU per worker-second", r["redis_us_per_worker_s"], "{:.1f}", "us",
               note=f"periodic work of each simulated worker: {rounds}"),
        Figure(part, "Redis connections of one worker", s["connections"], "{:.0f}", goal="<= 4",
               met=at_most(s["connections"], 4), note="CLIENT LIST, most seen while it stored samples: each one's last command "
                    + ", ".join(s.get("connections_seen", []))),
        Figure(part, "audit: Redis CPU per round", a["redis_ms_per_round"], "{:.2f}", "ms",
               note=f"{a['commands_per_round']:.0f} commands a round, slice {a['slice']:,}; "
                    f"{a['rounds']} rounds found {a['found']}/{a['lost']} lost prompts, {a['false']} others"),
        Figure(part, "longest command (99th pct of its kind)", r["longest"]["steady_ms"], "{:.2f}", "ms",
               goal="<= 10", met=at_most(r["longest"]["steady_ms"], 10),
               note=f"{r['longest']['steady']}; SLOWLOG at threshold 0 over {r['longest']['commands_seen']:,} "
                    f"commands of every part ({pinned}; wall time: the machine's other processes can still "
                    f"run on Redis's core): 99.9th pct {r['longest']['p999_ms']:.2f} ms ({r['longest']['p999']}), "
                    f"the longest single one {r['longest']['ms']:.2f} ms ({r['longest']['command']}); median of "
                    f"those Redis spent most time in: " + ", ".join(f"{k} {us:.0f} us" for k, (_, us) in
                                                  list(r["longest"].get("medians", {}).items())[:5])),
    ]


def _node_rate_figures(part: str, r: dict, pinned: str) -> list:
    from .report import Figure

    nr = r["node_rate"]
    shape = nr["shape"]
    trips = ", ".join(f"{k} {v:.2f}" for k, v in nr["round_trips_by_first_command"].items())
    return [
        Figure(part, "node rate: Redis CPU per stored sample", nr["redis_us_per_sample"], "{:.0f}", "us",
               note=f"{nr['drivers']} of the {r['workers']} simulated workers driven as nodes at "
                    f"{shape['rate']:g} samples/s batch ({nr['processes']} processes, a connection each): take and "
                    f"group commit of {shape['group']}, {shape['publishes']:g} task-event PUBLISH a group; "
                    f"{nr['samples']:,} samples at {nr['samples_per_s']:,.0f}/s in all, Redis "
                    f"{nr['redis_core_share']:.0%} of its core; {pinned}"),
        Figure(part, "node rate: round trips per stored sample", nr["round_trips_per_sample"], "{:.2f}",
               note=f"requests the clients sent, by first command: {trips}"),
        Figure(part, "node rate: Redis CPU per round trip", nr["redis_us_per_round_trip"], "{:.1f}", "us",
               note=f"INFO cpu over the clients' requests; the scripts' own time (EVALSHA in commandstats, wall) "
                    f"is {nr['scripts_us_per_sample']:.0f} us a sample, the rest "
                    f"{nr['redis_us_per_round_trip_besides_scripts']:.1f} us a round trip (reading the request, "
                    f"writing the reply, waking up for it, the commands besides the scripts)"),
        Figure(part, "node rate: Redis commands per stored sample", nr["commands_per_sample"], "{:.1f}",
               note="INFO commandstats, a script's own commands counted: " + _commands(nr["by_command"])),
    ]


def _commands(by_command: dict) -> str:
    return ", ".join(f"{name} {c['calls']:g} ({c['us']:.0f} us)"
                     for name, c in sorted(by_command.items(), key=lambda kv: -kv[1]["calls"])[:8])


def _projection_figures(projection: dict, o: dict) -> list:
    from .report import Figure, at_most

    figures, most = [], max(o["nodes"])
    nr, rw = projection["node rate"], projection["real worker"]
    for n in o["nodes"]:
        x, judged = nr["nodes"][n], n == most
        figures.append(Figure(
            "9 fleet size, projected", f"{n:,} nodes: Redis cores (node rate)", x["cores"], "{:.2f}",
            goal=f"<= {GOAL_CORES:g}" if judged else "", met=at_most(x["cores"], GOAL_CORES) if judged else None,
            note=f"{o['rate']:g} samples/s and {o['in_flight']} in flight a node ({x['in_flight']:,} in all): "
                 f"{x['commands_per_s']:,.0f} commands/s, {x['connections']:,} connections; per node "
                 f"{nr['per_node_us_per_s']:.0f} us/s (samples {nr['samples_us_per_s']:.0f}: "
                 f"{nr['round_trips_per_sample']:.2f} round trips x {nr['us_per_round_trip']:.1f} us a sample; "
                 f"periodic {nr['periodic_us_per_s']:.0f}), audit {nr['audit_us_per_s']:.0f} us/s"))
        figures.append(Figure(
            "9 fleet size, projected", f"{n:,} nodes: Redis cores (one real worker's sample)",
            rw["nodes"][n]["cores"], "{:.2f}",
            note=f"per node {rw['per_node_us_per_s']:.0f} us/s (task events {rw['events_us_per_s']:.0f}): "
                 f"its samples amortize takes and commits a node at {o['rate']:g}/s cannot"))
    figures.append(Figure(
        "9 fleet size, projected", f"{most:,} nodes: Redis CPU a sample may cost", nr["sample_budget_us"], "{:.0f}",
        "us", note=f"what the goal leaves a sample after the periodic work and the audit: "
                   f"{nr['round_trip_budget']:.2f} round trips at {nr['us_per_round_trip']:.1f} us "
                   f"(measured {nr['round_trips_per_sample']:.2f})"))
    return figures
