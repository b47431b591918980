"""What the dashboard's panels say about a live worker, without Prometheus or Grafana.

    python deploy/grafana/evaluate.py http://127.0.0.1:9808/metrics --seconds 30

Scrapes the worker's /metrics twice, `--seconds` apart, evaluates every panel's query
over the two scrapes (deploy/grafana/promql.py says how far that goes) and prints a
Markdown table: panel, query, value; then whether each alert's condition
(deploy/prometheus/alerts.yml) holds over the same scrapes. The table in docs/operate/prometheus-grafana.md was made this way.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import promql  # noqa: E402  (this folder is not a package)

DASHBOARD = Path(__file__).resolve().parent / "fleet.json"
ALERTS = Path(__file__).resolve().parents[1] / "prometheus" / "alerts.yml"


def scrape(url: str) -> promql.Scrape:
    at = time.monotonic()
    return promql.Scrape.of(httpx.get(url, timeout=10).text, at)


def show(value) -> str:
    if isinstance(value, float):
        return _number(value)
    if not value:
        return "(no series)"
    parts = []
    for labels, v in sorted(value, key=lambda s: sorted(s[0].items())):
        name = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
        parts.append(f"{name + ': ' if name else ''}{_number(v)}")
    return "; ".join(parts)


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a worker's /metrics URL")
    parser.add_argument("--seconds", type=float, default=30.0, help="between the two scrapes")
    args = parser.parse_args()
    before = scrape(args.url)
    time.sleep(args.seconds)
    after = scrape(args.url)
    print("| panel | query | value |\n|---|---|---|")
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "sglang:" in expr and "sglang:" not in "".join(after.series):
                value = "(a server's own /metrics)"
            else:
                value = show(promql.evaluate(expr, before, after))
            print(f"| {panel['title']} | `{expr}` | {value} |")
    import yaml

    print()
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            firing = promql.evaluate(rule["expr"], before, after)
            print(f"- {rule['alert']}: {'condition holds: ' + show(firing) if firing else 'condition does not hold'}")


if __name__ == "__main__":
    main()
