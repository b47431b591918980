"""`GET /metrics`: the Prometheus series of SGLang's that the fleet reads, by SGLang's names.

Names, types and the `model_name` label (the served model name) follow SGLang's
`python/sglang/srt/metrics/collector.py` and its Production Metrics page:
`sglang:prompt_tokens_total` and `sglang:cached_tokens_total` are counters the
tokenizer manager adds to when a request finishes (so they equal the sums of
`prompt_tokens` and `cached_tokens` over the answers of scheduled requests),
`sglang:num_running_reqs` and `sglang:num_queue_reqs` are the scheduler's
gauges. The hit share is rate(cached) / rate(prompt), not SGLang's
`sglang:cache_hit_rate` gauge: that is the last prefill batch's, and decode
logging resets it to 0 (sglang issues #5625, #12459). Served only with
`--enable-metrics`, as SGLang (404 otherwise). SGLang 0.5.23 labels its
series with more than `model_name` (engine_type, tp_rank, cache_source...);
the stand-in carries `model_name` alone.

Values are read from the server's `Stats` and `Engine` at scrape time (a
custom collector), so there is one count per fact and nothing to keep in step.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response

from sglang_standin.state import StandinState


class _StandinCollector:
    """Yields the series from one server's state at each scrape."""

    def __init__(self, state: StandinState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        labels = [str(state.cfg.served_model_name)]
        series = [
            (CounterMetricFamily, "sglang:prompt_tokens", "Number of prefill tokens processed.",
             state.stats.prompt_tokens),
            (CounterMetricFamily, "sglang:cached_tokens", "Number of cached prompt tokens.",
             state.stats.cached_tokens),
            (GaugeMetricFamily, "sglang:num_running_reqs", "The number of running requests.",
             state.engine.running_count),
            (GaugeMetricFamily, "sglang:num_queue_reqs", "The number of requests in the waiting queue.",
             state.engine.waiting_count),
        ]
        for family, name, doc, value in series:
            metric = family(name, doc, labels=["model_name"])
            metric.add_metric(labels, value)
            yield metric


def registry_for(state: StandinState) -> CollectorRegistry:
    """A registry of its own per server (tests run several servers in one process)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_StandinCollector(state))
    return registry


async def metrics(request: Request) -> Response:
    """The route: the Prometheus text exposition format, as prometheus_client writes it."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
