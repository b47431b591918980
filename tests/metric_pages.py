"""What a Prometheus page says (a worker's FLEET_METRICS_PORT, the gateway's, a server's), read with
prometheus_client's own parser: tests ask for a metric by its name and labels, never by a regex of the
text format, so a label added or reordered, or a value written as 1e+03, reads the same."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(url: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """Each sample called `name` (a counter's with its `_total`) on the page at `url` whose labels
    include `labels`, as (its labels, its value)."""
    text = httpx.get(url, timeout=10).text
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()]


def sum_of(url: str, name: str, **labels: str) -> float:
    """The sum of those samples' values (0 where there are none)."""
    return sum(value for _, value in samples(url, name, **labels))


def by_label(url: str, name: str, label: str, **labels: str) -> dict[str, float]:
    """Those samples' values by one label's value, leaving out zeros (a counter never yet counted)."""
    return {found[label]: value for found, value in samples(url, name, **labels) if value}


def worker_page(port: int) -> str:
    """The address of a worker's metrics page, served on FLEET_METRICS_PORT."""
    return f"http://127.0.0.1:{port}/metrics"
