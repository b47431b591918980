"""The report's HTML: one self-contained file, its charts, tables, examples and data inlined.

Nothing on the page refers to anything outside it: no stylesheet, script,
font or image is linked (the charts are inline SVG, the style and the few
lines of script are in the page), so it opens from a file, offline, as it was
written. The figures dict is embedded whole as JSON (`#report-data`), and key
numbers also carry `data-figure` attributes, so what the page says can be
checked against the shards.
"""
from __future__ import annotations

import datetime as dt
import html
import json

from contract.fleet.cache_hits import share_text
from contract.run.spec import RunSpec

from contract.counts import counted
from ..show import Decoder, Shown, clipped_segments

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#222;background:#fafafa}
header,main{max-width:1500px;margin:0 auto;padding:0 24px}
header{padding-top:16px}h1{font-size:22px;margin:8px 0}h1 code{font-size:22px}h2{font-size:18px;margin:28px 0 8px}
.sub{color:#666}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:12px}
.bad{color:#c0392b}.good{color:#2e7d32}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(620px,1fr));gap:14px}
figure.chart{background:#fff;border:1px solid #ddd;border-radius:6px;margin:0;padding:10px 12px}
figure.chart h3{margin:0;font-size:15px}figure.chart p.healthy{margin:2px 0 6px;color:#2e7d32;font-size:12.5px}
figure.chart svg{width:100%;height:auto}.pair{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
table{border-collapse:collapse;background:#fff;margin:6px 0}td,th{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top;font-size:13px}th{background:#f0f0f0}td.n{text-align:right}
code{font-size:12.5px}details{background:#fff;border:1px solid #ddd;border-radius:6px;margin:6px 0;padding:6px 10px}
summary{cursor:pointer}pre{white-space:pre-wrap;word-break:break-word;font-size:12.5px;max-height:640px;
overflow:auto;background:#f6f8fa;padding:8px}.special{background:#fde68a;color:#7c2d12;border-radius:3px}
"""
SCRIPT = """
function openTarget(){var t=document.getElementById(location.hash.slice(1));if(t&&t.tagName==='DETAILS'){t.open=true;}}
window.addEventListener('hashchange',openTarget);openTarget();
"""
BUCKETS = {"shortest": "shortest outputs", "longest": "longest outputs", "truncated": "finish 'length'",
           "unclosed": "reasoning never closed", "no_stop_token": "no stop token at the end",
           "empty_answer": "empty answers", "repeated": "outputs repeated across prompts"}


def page(spec: RunSpec, status: dict, data: dict, charts: list, examples: list[dict], built: dict) -> str:
    """The whole page. `charts`: (Chart, svg, marks); `examples`: {id, buckets, shown, decoder}."""
    anchors = {e["id"]: f"show-{n}" for n, e in enumerate(examples)}
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>Run report: {_e(spec.name)}</title><style>{STYLE}</style></head><body>",
             _header(spec, status, data, built), "<main>", _identity(spec, data), "<h2>Charts</h2><div class='charts'>",
             *(_chart(chart, svg, marks) for chart, svg, marks in charts), "</div>",
             _servers(data), _dead_letters(data, anchors), _examples_index(data, anchors),
             "<h2>Examples</h2><p class='sub'>Decoded with the run's tokenizer; special tokens "
             "<span class='special'>highlighted</span>; long sections shortened here "
             "(<code>python -m producer show ID [--ids]</code> prints everything).</p>",
             *(_example(e, anchors[e["id"]]) for e in examples),
             f"<script type='application/json' id='report-data'>{_json(data, status, spec, built)}</script>",
             f"<script>{SCRIPT}</script></main></body></html>"]
    return "\n".join(parts)


def _header(spec: RunSpec, status: dict, data: dict, built: dict) -> str:
    samples, quality = data["samples"], data["quality"]
    agree = samples["unique_ids"] == status["done"]
    several = status.get("samples_per_prompt", 1) > 1  # then stored, dead and pending count samples
    cards = [("prompts", status["prompts"], ""),
             *([(f"samples ({status['samples_per_prompt']} a prompt)", status["samples"], "")] if several else []),
             ("stored", status["done"], ""),
             ("dead letters", status["dead"], "bad" if status["dead"] else ""),
             ("pending", status["pending"], ""), ("output tokens", status["output_tokens"], ""),
             ("samples in shards", samples["unique_ids"], "" if agree else "bad"),
             ("truncated (stored)", quality["counts"]["truncated"], "bad" if quality["counts"]["truncated"] else ""),
             ("empty answers", quality["counts"]["empty_answer"], "bad" if quality["counts"]["empty_answer"] else ""),
             ("repeated outputs", quality["counts"]["repeated"], "bad" if quality["counts"]["repeated"] else ""),
             ("prefix-cache hits, all stored samples", share_text(data["cache"]["share"]), "")]
    cards += _verification_cards(status.get("verification"))
    html_cards = "".join(f"<div class='card'><b class='{cls}' data-figure='{_e(label)}'>{_card(value)}</b>"
                         f"<span>{_e(label)}</span></div>" for label, value, cls in cards)
    state = "finished" if status["finished"] else f"{status['pending']:,} prompts still pending"
    note = "" if agree else (f"<p class='bad'>The shards hold {samples['unique_ids']:,} distinct samples but the "
                             f"ledger counted {status['done']:,} done when the report began (a run still writing).</p>")
    return (f"<header><h1>Run report: <code>{_e(spec.name)}</code></h1>"
            f"<div class='sub'>{state}; read {_e(built['at'])} from {counted(built['shards'], 'shard')} under "
            f"<code>{_e(built['folder'])}</code> ({counted(samples['rows'], 'row')}, {samples['duplicate_rows']:,} stored "
            f"twice) and {data['dead_letters']['total']:,} dead letters.</div>"
            f"<div class='cards'>{html_cards}</div>{note}</header>")


def _verification_cards(figures: dict | None) -> list[tuple[str, object, str]]:
    """A run with a verifier (`enqueue --verify`): the ledger's counts by verdict, the pass rate,
    and the samples spent (stored or dead-lettered) per one that passed (`producer.status.verification`)."""
    if not figures:
        return []
    rate, spent = figures["pass_rate"], figures["samples_per_verified"]
    return [("verified (passed)", figures["passed"], ""), ("failed verification", figures["failed"], ""),
            ("verifier errors", figures["error"], "bad" if figures["error"] else ""),
            ("pass rate", "-" if rate is None else f"{rate:.1%}", ""),
            ("samples per verified", "-" if spent is None else f"{spent:,.2f}", "")]


def _identity(spec: RunSpec, data: dict) -> str:
    rows = [("tokenizer", spec.tokenizer), ("tokenizer fingerprint", spec.tokenizer_fingerprint),
            ("template fingerprint", spec.template_fingerprint), ("run fingerprint", spec.fingerprint()),
            ("sampling", json.dumps(spec.sampling, sort_keys=True)), ("thinking", spec.thinking),
            ("think-start / think-end ids", f"{spec.think_start_id} / {spec.think_end_id}"),
            ("stop ids", ", ".join(map(str, spec.stop_ids))), ("served model", spec.served_model or "(any)"),
            ("disabled rules", ", ".join(spec.disabled_rules) or "(none)"),
            ("verifier", spec.verify or "(none)"),
            ("created", _when(spec.created_at))]
    spec_table = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(str(v))}</code></td></tr>" for k, v in rows)
    expected = {"tokenizer_fingerprint": spec.tokenizer_fingerprint, "template_fingerprint": spec.template_fingerprint,
                "max_new_tokens": spec.sampling.get("max_new_tokens"), "temperature": spec.sampling.get("temperature"),
                "top_p": spec.sampling.get("top_p")}
    seen = []
    for column, values in data["consistency"].items():
        cells = ", ".join(_seen_value(column, v, n, expected) for v, n in values.items()) or "(no samples)"
        seen.append(f"<tr><th>{_e(column)}</th><td>{cells}</td></tr>")
    return ("<h2>Identity</h2><p class='healthy sub'>Healthy: the shards hold one tokenizer and one template "
            "fingerprint, both the spec's, and the spec's sampling (a larger max_new_tokens only on requeued "
            "prompts).</p><div class='pair'><table><tr><th colspan='2'>the run's spec</th></tr>"
            f"{spec_table}</table><table data-table='consistency'><tr><th colspan='2'>values in the shards "
            f"(samples)</th></tr>{''.join(seen)}</table></div>")


def _seen_value(column: str, value: str, count: int, expected: dict) -> str:
    want = expected.get(column)
    off = want is not None and str(value) != str(round(want, 6) if isinstance(want, float) else want)
    return f"<code class='{'bad' if off else ''}'>{_e(value)}</code> ({count:,})"


def _chart(chart, svg: str, marks: int) -> str:
    return (f"<figure class='chart' id='chart-{chart.name}' data-chart='{chart.name}' data-marks='{marks}'>"
            f"<h3>{_e(chart.title)}</h3><p class='healthy'>{_e(chart.healthy)}</p>{svg}</figure>")


def _servers(data: dict) -> str:
    rows = "".join(
        f"<tr><td><code>{_e(s['server'])}</code></td><td class='n'>{s['samples']:,}</td>"
        f"<td class='n'>{s['output_tokens']:,}</td><td class='n'>{s['busy_s']:,.1f}</td>"
        f"<td class='n'>{s['tokens_per_s']:,.1f}</td><td class='n'>{_num(s['latency_s']['p50'])}</td>"
        f"<td class='n'>{_num(s['latency_s']['p90'])}</td><td class='n'>{_num(s['latency_s']['max'])}</td>"
        f"<td class='n'>{share_text(s['cache']['share'])}</td></tr>"
        for s in data["servers"])
    return ("<h2>Servers</h2><table data-table='servers'><tr><th>server</th><th>samples</th><th>output tokens</th>"
            "<th>busy s</th><th>tokens/s over busy s</th><th>latency p50 s</th><th>p90 s</th><th>max s</th>"
            "<th>prefix-cache hits</th></tr>"
            f"{rows or '<tr><td colspan=9>no samples yet</td></tr>'}</table>")


def _dead_letters(data: dict, anchors: dict) -> str:
    dead = data["dead_letters"]
    rows = "".join(
        f"<tr><td><code>{_e(reason)}</code></td><td class='n' data-figure='dead:{_e(reason)}'>{count:,}</td>"
        f"<td>{_links(data['examples'].get(f'dead:{reason}', []), anchors)}</td></tr>"
        for reason, count in dead["by_reason"].items())
    return ("<h2>Dead letters</h2><p class='sub'>Each reason code says what went wrong; "
            "<code>python -m producer dead list --reason CODE</code> lists them, <code>dead requeue</code> replays "
            "them.</p><table data-table='dead-letters'><tr><th>reason</th><th>count</th><th>examples</th></tr>"
            f"{rows or '<tr><td colspan=3>no dead letters</td></tr>'}</table>")


def _examples_index(data: dict, anchors: dict) -> str:
    rows = "".join(f"<tr><th>{_e(label)}</th><td>{_links(data['examples'].get(bucket, []), anchors)}</td></tr>"
                   for bucket, label in BUCKETS.items() if data["examples"].get(bucket))
    return f"<h2>Samples to look at</h2><table data-table='examples'>{rows or '<tr><td>no samples yet</td></tr>'}</table>"


def _links(ids: list[str], anchors: dict) -> str:
    return ", ".join(f"<a href='#{anchors[i]}'><code>{_e(i)}</code></a>" if i in anchors else f"<code>{_e(i)}</code>"
                     for i in ids)


def _example(example: dict, anchor: str) -> str:
    shown: Shown = example["shown"]
    decoder: Decoder = example["decoder"]
    buckets = ", ".join(example["buckets"])
    return (f"<details id='{anchor}' data-example='{_e(example['id'])}'><summary><code>{_e(example['id'])}</code>: "
            f"{_e(buckets)}</summary><pre>{render_html(shown, decoder, example['limit'])}</pre></details>")


def render_html(shown: Shown, decoder: Decoder, limit: int | None) -> str:
    """What `show` prints, as HTML, with special tokens marked."""
    lines = [_e(shown.title)] + [f"! {_e(w)}" for w in shown.warnings + ([decoder.problem] if decoder.problem else [])]
    width = max((len(k) for k, _ in shown.fields), default=0)
    lines += [_e(f"  {k:<{width}}  {v}") for k, v in shown.fields]
    for section in shown.sections:
        lines += ["", f"<b>── {_e(section.heading)} ──</b>"]
        lines.append("".join(f"<span class='special'>{_e(t)}</span>" if special else _e(t)
                             for t, special in clipped_segments(section, decoder, limit)))
    return "\n".join(lines)


def _json(data: dict, status: dict, spec: RunSpec, built: dict) -> str:
    blob = {"figures": data, "status": {k: v for k, v in status.items() if k != "workers"},
            "spec": json.loads(spec.to_json()), "built": built}
    return json.dumps(blob, sort_keys=True).replace("</", "<\\/")


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


def _card(value) -> str:
    return value if isinstance(value, str) else f"{value:,}"


def _num(value) -> str:
    return "" if value is None else f"{value:,.3f}"


def _e(text) -> str:
    return html.escape(str(text), quote=True)
