"""What the dashboard's and the alert rules' PromQL asks of the fleet, and what it says.

Two uses, one parser (`promql-parser`, the Rust PromQL parser's Python binding):

- `selectors(query)`: every metric a query reads, with the labels the query relies on
  (its matchers, and the labels of the `by (...)`, `on (...)`, `ignoring (...)` and
  `without (...)` clauses applied to it). tests/test_deploy.py checks each `fleet_*`
  one against a real worker's /metrics, so a renamed metric or label fails there,
  not silently on a dashboard.
- `evaluate(query, before, after)`: an instant query over two scrapes of /metrics taken
  `after.at - before.at` seconds apart, for the table in docs/operate/prometheus-grafana.md. Enough PromQL for these
  queries (selectors, rate/increase, sum/max/min/avg/count, histogram_quantile, vector,
  arithmetic, comparisons, and/or); `rate` is the change between the two scrapes (a
  counter missing from the first started at 0: prometheus_client creates a labelled
  counter at its first increment), whatever window the query names.

Grafana's variables are replaced first (`$job` and `$run` match everything,
`$__rate_interval` is one minute). `job` and `instance` are the labels Prometheus adds
to each scraped target: a worker's own page never has them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import promql_parser as pp

TARGET_LABELS = frozenset({"job", "instance"})
VARIABLES = {"$__rate_interval": "1m", "${job}": ".*", "$job": ".*", "${run}": ".*", "$run": ".*"}


def substitute(query: str) -> str:
    for name, value in VARIABLES.items():
        query = query.replace(name, value)
    return query


def parse(query: str):
    return pp.parse(substitute(query))


# --- what a query reads ---------------------------------------------------------------

def selectors(query: str) -> list[tuple[str, frozenset[str]]]:
    """(metric name, labels the query uses on it) for every selector in the query."""
    found: list[tuple[str, frozenset[str]]] = []
    _walk(parse(query), frozenset(), found)
    return found


def _walk(node, grouping: frozenset[str], found: list) -> None:
    kind = type(node).__name__
    if kind == "VectorSelector":
        used = {m.name for m in node.matchers.matchers if m.name != "__name__"}
        found.append((node.name, frozenset(used) | grouping))
    elif kind == "MatrixSelector":
        _walk(node.vector_selector, grouping, found)
    elif kind == "AggregateExpr":
        labels = frozenset(node.modifier.labels) if node.modifier is not None else frozenset()
        _walk(node.expr, labels, found)  # the innermost aggregation groups the series
    elif kind == "BinaryExpr":
        matching = node.modifier.matching if node.modifier is not None else None
        labels = grouping | frozenset(matching.labels) if matching is not None else grouping
        _walk(node.lhs, labels, found)
        _walk(node.rhs, labels, found)
    elif kind == "Call":
        for arg in node.args:
            _walk(arg, grouping, found)
    elif kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        _walk(node.expr, grouping, found)


# --- scrapes ---------------------------------------------------------------------------

@dataclass
class Scrape:
    """One /metrics page: sample name -> [(labels, value)], taken at `at` (seconds)."""
    at: float
    series: dict[str, list[tuple[dict, float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, text: str, at: float) -> "Scrape":
        from prometheus_client.parser import text_string_to_metric_families

        scrape = cls(at)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                scrape.series.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return scrape


# --- an instant query over two scrapes -------------------------------------------------

Vector = list  # [(labels, value)]


def evaluate(query: str, before: Scrape, after: Scrape):
    """A float (scalar) or a list of (labels, value) (instant vector), as Prometheus would."""
    return _Eval(before, after).eval(parse(query))


class _Eval:
    def __init__(self, before: Scrape, after: Scrape):
        self.before, self.after = before, after
        self.seconds = after.at - before.at

    def eval(self, node):
        kind = type(node).__name__
        if kind == "NumberLiteral":
            return node.val
        if kind == "ParenExpr":
            return self.eval(node.expr)
        if kind == "UnaryExpr":
            value = self.eval(node.expr)
            return -value if isinstance(value, float) else [(l, -v) for l, v in value]
        if kind == "VectorSelector":
            return _select(self.after, node)
        if kind == "Call":
            return self.call(node)
        if kind == "AggregateExpr":
            return _aggregate(str(node.op), node.modifier, self.eval(node.expr))
        if kind == "BinaryExpr":
            return _binary(str(node.op), node.modifier, self.eval(node.lhs), self.eval(node.rhs))
        raise NotImplementedError(f"{kind} in {node}")

    def call(self, node):
        name = node.func.name
        if name in ("rate", "increase"):
            window = node.args[0]
            now = _select(self.after, window.vector_selector)
            then = {_key(l): v for l, v in _select(self.before, window.vector_selector)}
            per_second = [(l, max(0.0, v - then.get(_key(l), 0.0)) / self.seconds) for l, v in now]
            if name == "rate":
                return per_second
            return [(l, v * window.range.total_seconds()) for l, v in per_second]
        if name == "vector":
            return [({}, self.eval(node.args[0]))]
        if name == "histogram_quantile":
            return _quantile(self.eval(node.args[0]), self.eval(node.args[1]))
        raise NotImplementedError(f"function {name}")


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def _select(scrape: Scrape, selector) -> Vector:
    out = []
    for labels, value in scrape.series.get(selector.name, []):
        if all(_matches(m, labels.get(m.name, "")) for m in selector.matchers.matchers):
            out.append((labels, value))
    return out


def _matches(matcher, value: str) -> bool:
    op = str(matcher.op)
    if op.endswith("Re"):  # Re, NotRe: fully anchored, as in Prometheus
        hit = re.fullmatch(matcher.value, value) is not None
        return hit if op == "MatchOp.Re" else not hit
    return (value == matcher.value) == (op == "MatchOp.Equal")


def _grouped(modifier, labels: dict) -> dict:
    if modifier is None:
        return {}
    names = set(modifier.labels)
    if str(modifier.type).endswith("By"):
        return {k: v for k, v in labels.items() if k in names}
    return {k: v for k, v in labels.items() if k not in names}


def _aggregate(op: str, modifier, vector: Vector) -> Vector:
    groups: dict[tuple, tuple[dict, list[float]]] = {}
    for labels, value in vector:
        kept = _grouped(modifier, labels)
        groups.setdefault(_key(kept), (kept, []))[1].append(value)
    combine = {"sum": sum, "max": max, "min": min, "count": len,
               "avg": lambda xs: sum(xs) / len(xs)}[op]
    return [(labels, float(combine(values))) for labels, values in groups.values()]


_ARITHMETIC = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "/": lambda a, b: a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a))}
_COMPARE = {">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _binary(op: str, modifier, lhs, rhs):
    if op in ("and", "or", "unless"):
        return _set_op(op, modifier, lhs, rhs)
    fn = _ARITHMETIC.get(op) or _COMPARE[op]
    if isinstance(lhs, float) and isinstance(rhs, float):
        return float(fn(lhs, rhs))
    if isinstance(rhs, float):
        return [(l, fn(v, rhs) if op in _ARITHMETIC else v) for l, v in lhs if op in _ARITHMETIC or fn(v, rhs)]
    if isinstance(lhs, float):
        return [(l, fn(lhs, v) if op in _ARITHMETIC else v) for l, v in rhs if op in _ARITHMETIC or fn(lhs, v)]
    right = {_match_key(modifier, l): v for l, v in rhs}
    out = []
    for labels, value in lhs:
        other = right.get(_match_key(modifier, labels))
        if other is None:
            continue
        if op in _ARITHMETIC:
            out.append((labels, fn(value, other)))
        elif fn(value, other):
            out.append((labels, value))
    return out


def _match_key(modifier, labels: dict) -> tuple:
    matching = modifier.matching if modifier is not None else None
    if matching is None:
        return _key(labels)
    names = set(matching.labels)
    if str(matching.type).endswith("Include"):  # on (...)
        return _key({k: v for k, v in labels.items() if k in names})
    return _key({k: v for k, v in labels.items() if k not in names})


def _set_op(op: str, modifier, lhs: Vector, rhs: Vector) -> Vector:
    right = {_match_key(modifier, l) for l, _ in rhs}
    if op == "and":
        return [(l, v) for l, v in lhs if _match_key(modifier, l) in right]
    if op == "unless":
        return [(l, v) for l, v in lhs if _match_key(modifier, l) not in right]
    left = {_match_key(modifier, l) for l, _ in lhs}
    return lhs + [(l, v) for l, v in rhs if _match_key(modifier, l) not in left]


def _quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket that holds
    the q-th observation; NaN for a histogram with no observations."""
    groups: dict[tuple, tuple[dict, list[tuple[float, float]]]] = {}
    for labels, value in buckets:
        rest = {k: v for k, v in labels.items() if k != "le"}
        groups.setdefault(_key(rest), (rest, []))[1].append((float(labels["le"]), value))
    out = []
    for labels, pairs in groups.values():
        pairs.sort()
        total = pairs[-1][1]
        if total <= 0:
            out.append((labels, math.nan))
            continue
        rank, lower, below = q * total, 0.0, 0.0
        for upper, count in pairs:
            if count >= rank:
                if math.isinf(upper):
                    out.append((labels, lower))
                else:
                    inside = count - below
                    out.append((labels, lower + (upper - lower) * ((rank - below) / inside if inside else 0)))
                break
            lower, below = upper, count
    return out
