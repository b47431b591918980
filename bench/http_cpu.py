"""`python -m bench --parts http`: each HTTP/1.1 parser's CPU per `/generate` request, and the worker's call.

The candidates (`worker`, and the parsers of `bench/http_parsers.py`) each run in
children of `bench.http_clients` at each number in flight, `repeat` times round;
the figures are each one's CPU per request and h11's / llhttp's.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from . import http_clients
from .report import Figure

PARSERS = ("parse-httptools", "parse-h11")
CANDIDATES = ("worker", *PARSERS)


@dataclass
class HttpOptions:
    threads: tuple[int, ...] = (16, 256)
    requests: int = 3000
    seconds: float = 5.0
    repeat: int = 2


def run_http(opts: HttpOptions, log) -> dict:
    """Each candidate at each N, `repeat` times round, in children of `bench.http_clients`."""
    args = http_clients.parse_args([
        "--clients", ",".join(CANDIDATES), "--threads", ",".join(map(str, opts.threads)),
        "--requests", str(opts.requests), "--seconds", str(opts.seconds), "--repeat", str(opts.repeat)])
    return http_clients.measure(args, log)


def http_figures(d: dict) -> list[Figure]:
    by = {(r["client"], r["n"]): r.get("cpu_us_per_request") for r in d["results"]}
    figures = []
    for (client, n), cpu in sorted(by.items(), key=lambda kv: (kv[0][1], CANDIDATES.index(kv[0][0]))):
        figures.append(Figure("http", f"{client}: CPU per /generate request, {n} in flight", cpu, "{:.0f}", "us",
                              note="the client process's CPU; the lower median of the runs"))
    for n in sorted({n for _, n in by}):
        ht, h11 = by.get(("parse-httptools", n)), by.get(("parse-h11", n))
        figures.append(Figure("http", f"h11 / llhttp CPU per request, {n} in flight",
                              h11 / ht if ht and h11 else None, "{:.2f}",
                              note="above 1: llhttp (httptools) costs less; the worker parses with it"))
    return figures


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http-threads", default="16,256", help="http: requests in flight (threads), comma-separated")
    p.add_argument("--http-requests", type=int, default=3000, help="http: requests per window at most")
    p.add_argument("--http-repeat", type=int, default=2, help="http: runs of each candidate at each N")
