"""Prefix cache: does the fleet's routing reuse SGLang's radix cache as well as the best possible client?

Two workloads on four stand-ins whose prefix caches (`--prefix-cache-tokens`)
cannot each hold every prefix, and whose prefill is charged per uncached
prompt token (`--prefill-per-token`), so a miss costs time as on a GPU:

- **conversations**: whole conversations of 3-6 user turns, regenerated turn
  by turn (`enqueue --turns all`): turn k+1's prompt starts with turn k's.
- **shared system prompts**: single prompts under 8 system prompts of about
  1,500 tokens each, in a shuffled order, an equal number under each.
- **samples** (`--cache-workloads samples`, not in the default set):
  distinct prompts of about 1,000 tokens, each sampled N times (`enqueue
  --samples N`, default 4): every sample of a prompt has its ids, so at best
  N - 1 of N hit the cache (the oracle sends a prompt's samples to one
  server, prompts spread evenly). The stand-ins draw each answer with its
  `sampling_seed` (`--seeded-outputs`), so a prompt's samples differ in
  length and tokens as a real model's do, and the oracle sends the seeds the
  fleet does (the same run name's), so both sides generate the same tokens.

Three sides per workload, each on fresh stand-ins: (a) the **oracle**
(`oracle_conversations`, `oracle_shared`), an asyncio client that sends every
request of one conversation, or of one system prompt, to one server (each
server gets an equal share: conversations placed longest first on the server
with the fewest turns, system prompt j on server j mod 4), with each server's
batch of requests always in flight, and each next turn the moment its
previous one answers; (b) the **fleet** at its defaults: one real worker,
started once the run's spec exists and warm (it has loaded the run's
tokenizer, as the oracle has), drains what the producer enqueues; (c) the
same fleet with `FLEET_AFFINITY=off`.

Figures, from the servers' own counters: the **hit share** is the sum of
`sglang:cached_tokens_total` over the sum of `sglang:prompt_tokens_total`
(`/metrics`); **throughput** is output tokens over each server's own window
(`bench.saturation.server_throughput`), summed; **balance** is the most output
tokens one server generated over the mean. Both sides render every turn the
same way (the fleet's own `contract.chat.conversations` and tokenizer), so their
prompt-token totals agree, which the table checks.
"""
from __future__ import annotations

import asyncio
import random
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from contract.run.samples import sample_seed

from .lab import Lab, Standin
from .prompts import long_prompts, write_jsonl
from .publish import build_spec, chat_tokenizer, enqueue, prepare, sampling_params, token_count
from .saturation import server_throughput

SIDES = ("oracle", "fleet", "fleet, affinity off")


@dataclass
class CacheOptions:
    servers: int = 4
    batch: int = 16
    conversations: int = 480            # 3-6 turns each
    shared_prompts: int = 1280          # under `system_prompts` system prompts
    system_prompts: int = 8
    system_tokens: int = 1500
    user_tokens: int = 150              # one user message
    conversation_cache_tokens: int = 0        # per server; 0: 400 x conversations (a quarter of them fit, not all)
    shared_cache_tokens: int = 6_000          # per server: 2 system prompts and the answers fit, not 8
    sampled_prompts: int = 320          # the samples workload: distinct prompts...
    samples: int = 4                    # ...each sampled this many times
    sampled_tokens: int = 1000          # tokens of each (one user message)
    samples_cache_tokens: int = 40_000  # per server: about 36 prompts with their answers, of the 80 it gets
    output_len_median: float = 120
    output_len_sigma: float = 0.5
    output_len_max: int = 400
    step_base: float = 0.008
    step_per_request: float = 0.00002
    prefill_per_token: float = 0.00001  # an uncached 1,500-token prompt costs about 2 decode steps
    max_new_tokens: int = 1024
    seed: int = 7
    timeout: float = 900.0
    workloads: tuple[str, ...] = ("conversations", "shared")
    fleet_env: dict = field(default_factory=dict)  # extra worker settings on both fleet sides (--fleet-env)

    def standin_options(self, cache_tokens: int) -> list[str]:
        return ["--enable-metrics", "--max-running-requests", str(self.batch),
                "--prefix-cache-tokens", str(cache_tokens),
                "--prefill-per-token", str(self.prefill_per_token),
                "--output-len-median", str(self.output_len_median),
                "--output-len-sigma", str(self.output_len_sigma), "--output-len-max", str(self.output_len_max),
                "--step-base", str(self.step_base), "--step-per-request", str(self.step_per_request)]


# ---------------------------------------------------------------------------------- workloads

def _texts(n: int, tokens: int) -> list[str]:
    """n user texts of about `tokens` tokens, from the bundled examples."""
    return [m[0]["content"] for _, m in long_prompts(n, tokens, token_count)]


def conversation_records(opts: CacheOptions) -> list[dict]:
    """Conversations of 3-6 user turns (seeded), each with its original answers as placeholders."""
    rng = random.Random(opts.seed)
    texts = _texts(64, opts.user_tokens)
    records = []
    for i in range(opts.conversations):
        messages = []
        for t in range(rng.randint(3, 6)):
            messages += [{"role": "user", "content": f"Conversation {i}, turn {t}. {texts[(7 * i + t) % len(texts)]}"},
                         {"role": "assistant", "content": "original answer"}]
        records.append({"id": f"c{i:05d}", "messages": messages})
    return records


def shared_records(opts: CacheOptions) -> list[dict]:
    """Single prompts, an equal number under each system prompt, shuffled (seeded)."""
    systems = [f"System prompt {j}. {text}" for j, text in enumerate(_texts(opts.system_prompts, opts.system_tokens))]
    texts = _texts(64, opts.user_tokens // 2)
    records = [{"id": f"s{i:05d}", "system": i % opts.system_prompts, "messages": [
        {"role": "system", "content": systems[i % opts.system_prompts]},
        {"role": "user", "content": f"Question {i}. {texts[i % len(texts)]}"}]} for i in range(opts.shared_prompts)]
    random.Random(opts.seed).shuffle(records)
    return records


def sampled_records(opts: CacheOptions) -> list[dict]:
    """Distinct prompts (each its own opening words, then a text of about `sampled_tokens` tokens)."""
    texts = _texts(64, opts.sampled_tokens)
    return [{"id": f"q{i:05d}", "messages": [{"role": "user", "content": f"Prompt {i}. {texts[i % len(texts)]}"}]}
            for i in range(opts.sampled_prompts)]


# ---------------------------------------------------------------------------------- the oracle

class _Lanes:
    """Each server's own queue of work, drained by `batch` lanes per server."""

    def __init__(self, urls: list[str], batch: int):
        self.urls, self.batch = urls, batch
        self.errors = 0

    async def run(self, queues: list[deque], work) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        timeout = httpx.Timeout(3600.0, connect=10.0)
        lanes = [(url, queue, httpx.AsyncClient(limits=limits, timeout=timeout, verify=False))
                 for url, queue in zip(self.urls, queues) for _ in range(self.batch)]

        async def lane(url: str, queue: deque, client: httpx.AsyncClient) -> None:
            while queue:
                await work(url, client, queue.popleft())

        try:
            await asyncio.gather(*(lane(*x) for x in lanes))
        finally:
            await asyncio.gather(*(client.aclose() for _, _, client in lanes))

    async def post(self, client: httpx.AsyncClient, url: str, rid: str, ids: list[int], sampling: dict) -> list[int]:
        body = {"input_ids": ids, "sampling_params": sampling, "rid": rid, "stream": False}
        for _ in range(5):
            try:
                response = await client.post(f"{url}/generate", json=body)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                continue  # a dropped connection: sent again, as any client would
            if response.status_code == 200:
                return response.json()["output_ids"]
            break
        self.errors += 1
        return []


def oracle_shared(urls: list[str], records: list[dict], opts: CacheOptions) -> dict:
    """Every prompt of system prompt j to server j mod N, `batch` in flight on each server."""
    chat, sampling = chat_tokenizer(), sampling_params(opts.max_new_tokens)
    queues = [deque() for _ in urls]
    for record, ids in zip(records, chat.render([r["messages"] for r in records])):
        queues[record["system"] % len(urls)].append((record["id"], ids))
    lanes = _Lanes(urls, opts.batch)

    async def work(url, client, item) -> None:
        await lanes.post(client, url, item[0], item[1], sampling)

    started = time.process_time()
    asyncio.run(lanes.run(queues, work))
    return {"errors": lanes.errors, "client_cpu_s": time.process_time() - started}


def oracle_samples(urls: list[str], records: list[dict], opts: CacheOptions) -> dict:
    """Every sample of prompt i to server i mod N, `batch` in flight on each server; a server's prompts
    taken `batch` at a time, sample 0 of each, then sample 1 of each, ..., so a prompt's next sample
    comes a generation after the one before it, once that one's prompt is in the cache (sent one
    after the other, the samples of a prompt, whose stand-in answers are alike, would start and end
    in the same steps, and never find each other's prompt cached)."""
    chat, sampling = chat_tokenizer(), sampling_params(opts.max_new_tokens)
    queues = [deque() for _ in urls]
    mine: list[list] = [[] for _ in urls]
    for i, (record, ids) in enumerate(zip(records, chat.render([r["messages"] for r in records]))):
        mine[i % len(urls)].append((record["id"], ids))
    for queue, prompts in zip(queues, mine):
        for start in range(0, len(prompts), opts.batch):
            chunk = prompts[start:start + opts.batch]
            queue.extend((f"{pid}~{k}", ids) for k in range(opts.samples) for pid, ids in chunk)
    lanes = _Lanes(urls, opts.batch)

    async def work(url, client, item) -> None:
        prompt, _, index = item[0].rpartition("~")  # the seed the fleet's run sends for this sample
        seeded = {**sampling, "sampling_seed": sample_seed(_run_name("samples", {}), prompt, int(index))}
        await lanes.post(client, url, item[0], item[1], seeded)

    started = time.process_time()
    asyncio.run(lanes.run(queues, work))
    return {"errors": lanes.errors, "client_cpu_s": time.process_time() - started}


def oracle_conversations(urls: list[str], records: list[dict], opts: CacheOptions) -> dict:
    """Every turn of a conversation to one server, each next turn rendered as the fleet renders it
    and sent the moment the previous one answers; conversations placed longest first on the
    server with the fewest turns."""
    from contract.chat.conversations import answer_message, skeleton, turn_history, turns

    chat, spec = chat_tokenizer(), build_spec("oracle", opts.max_new_tokens, turns="all")
    sampling = dict(spec.sampling)
    shapes = [(r["id"], skeleton(r["messages"])) for r in records]
    queues, load = [deque() for _ in urls], [0] * len(urls)
    for cid, shape in sorted(shapes, key=lambda x: -turns(x[1])):
        server = load.index(min(load))
        queues[server].append((cid, shape))
        load[server] += turns(shape)
    lanes = _Lanes(urls, opts.batch)
    decode = lambda ids: chat.tok.decode(ids, skip_special_tokens=False)  # noqa: E731

    async def work(url, client, item) -> None:
        cid, shape = item
        answers: list[dict] = []
        for turn in range(turns(shape)):
            ids = chat.render([turn_history(shape, answers, turn)])[0]
            output = await lanes.post(client, url, f"{cid}#{turn}", ids, sampling)
            if not output:
                return
            answer = answer_message(output, spec.think_start_id, spec.think_end_id, spec.stop_ids, decode)
            if not spec.history_reasoning:
                answer.pop("reasoning_content", None)
            answers.append(answer)

    started = time.process_time()
    asyncio.run(lanes.run(queues, work))
    return {"errors": lanes.errors, "client_cpu_s": time.process_time() - started}


# ---------------------------------------------------------------------------------- measuring

_SERIES = re.compile(r"^(sglang:(?:cached|prompt)_tokens_total)\{[^}]*\}\s+([0-9.e+]+)$", re.MULTILINE)


def cache_counters(standin: Standin) -> dict[str, float]:
    """The server's own prompt and cached token counters, from its `/metrics`."""
    text = httpx.get(f"{standin.url}/metrics", timeout=30).text
    found = {name: float(value) for name, value in _SERIES.findall(text)}
    return {"prompt_tokens": found["sglang:prompt_tokens_total"], "cached_tokens": found["sglang:cached_tokens_total"]}


def _summary(standins: list[Standin]) -> dict:
    counters = [cache_counters(s) for s in standins]
    stats = [s.stats() for s in standins]
    prompt = sum(c["prompt_tokens"] for c in counters)
    cached = sum(c["cached_tokens"] for c in counters)
    tokens = [s["tokens_generated"] for s in stats]
    mean = sum(tokens) / len(tokens)
    return {"hit_share": cached / prompt if prompt else 0.0, "prompt_tokens": prompt, "cached_tokens": cached,
            "per_server": counters, "throughput": server_throughput(stats),
            "requests": [s["requests"] for s in stats],
            "balance": max(tokens) / mean if mean else None}


def _standin_options(workload: str, opts: CacheOptions) -> list[str]:
    """The stand-ins' options; for samples, answers drawn with each request's seed."""
    return opts.standin_options(_cache_tokens(workload, opts)) + ["--seeded-outputs"] * (workload == "samples")


def _run_name(workload: str, env: dict) -> str:
    return f"cache-{workload}-{'off' if env.get('FLEET_AFFINITY') == 'off' else 'on'}"


def measure_oracle(lab: Lab, workload: str, records: list[dict], opts: CacheOptions) -> dict:
    standins = lab.standins(opts.servers, _standin_options(workload, opts))
    try:
        urls = [s.url for s in standins]
        run = {"conversations": oracle_conversations, "samples": oracle_samples}.get(workload, oracle_shared)
        client = run(urls, records, opts)
        summary = _summary(standins)
    finally:
        lab.stop([s.process for s in standins])
    if client["errors"]:
        raise RuntimeError(f"oracle: {client['errors']} requests failed")
    return {**summary, **client}


def measure_fleet(lab: Lab, workload: str, prompt_file: Path, total: int, opts: CacheOptions,
                  env: dict[str, str]) -> dict:
    lab.flush()
    run = _run_name(workload, env)
    output_dir = lab.output_dir("cache")
    standins = lab.standins(opts.servers, _standin_options(workload, opts))
    workers = []
    turns = "all" if workload == "conversations" else "last"
    samples = opts.samples if workload == "samples" else 1
    try:
        # A worker that has been up a while: it has loaded the run's tokenizer (to render next
        # turns) before the first prompt, as the oracle has; `workers.output.turns.warm` logs it.
        prepare(run, opts.max_new_tokens, turns, samples)
        workers = [lab.worker(run, {"SGLANG_URLS": ",".join(s.url for s in standins),
                                    "OUTPUT_DIR": str(output_dir), **env})]
        if turns == "all":
            _wait_logged(workers[0], "tokenizer bundled loaded", opts.timeout)
        enqueue(prompt_file, run, opts.max_new_tokens, turns=turns, samples=samples)
        states = lab.wait_finished(run, total, opts.timeout, [*workers, *(s.process for s in standins)])
        summary = _summary(standins)
    finally:
        lab.stop(workers + [s.process for s in standins])
    if set(states) != {"done"}:
        raise RuntimeError(f"fleet run {run}: not every prompt stored: {states}")
    return {**summary, "states": states, "env": env}


def _wait_logged(process, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while line not in process.tail(400):
        if not process.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} never logged {line!r}:\n{process.tail(30)}")
        time.sleep(0.25)


def _cache_tokens(workload: str, opts: CacheOptions) -> int:
    if workload == "conversations":
        return opts.conversation_cache_tokens or 400 * opts.conversations
    return opts.samples_cache_tokens if workload == "samples" else opts.shared_cache_tokens


def run_cache(lab: Lab, opts: CacheOptions, log) -> dict:
    results = {}
    for workload in opts.workloads:
        records = {"conversations": conversation_records, "samples": sampled_records}.get(
            workload, shared_records)(opts)
        total = sum(sum(1 for m in r["messages"] if m["role"] == "user") for r in records) \
            if workload == "conversations" else len(records) * (opts.samples if workload == "samples" else 1)
        prompt_file = write_jsonl(lab.root / "prompts" / f"cache-{workload}.jsonl",
                                  [(r["id"], r["messages"]) for r in records])
        sides = {}
        units = "prompts" if workload == "samples" else workload
        log(f"cache {workload}: oracle, {len(records)} {units}, {total} requests")
        sides["oracle"] = measure_oracle(lab, workload, records, opts)
        log(f"  hit share {sides['oracle']['hit_share']:.3f}, "
            f"{sides['oracle']['throughput']['tokens_per_s']:,.0f} tok/s")
        for side, env in (("fleet", dict(opts.fleet_env)), ("fleet, affinity off",
                                                              {**opts.fleet_env, "FLEET_AFFINITY": "off"})):
            log(f"cache {workload}: {side}")
            sides[side] = measure_fleet(lab, workload, prompt_file, total, opts, env)
            log(f"  hit share {sides[side]['hit_share']:.3f}, "
                f"{sides[side]['throughput']['tokens_per_s']:,.0f} tok/s, balance {sides[side]['balance']:.3f}")
        results[workload] = {"requests": total, "units": len(records), "unit": units, "sides": sides,
                             "cache_tokens": _cache_tokens(workload, opts)}
    return results


NAMES = {"conversations": "conversations (--turns all)", "shared": "8 shared system prompts",
         "samples": "several samples a prompt (--samples)"}


def cache_figures(results: dict, hit_goal: float = 0.9, speed_goal: float = 0.97,
                  balance_goal: float = 1.10) -> list:
    """Per workload: each side's hit share and throughput, the fleet's against the oracle's."""
    from .report import Figure, at_least, at_most

    figures = []
    for workload, r in results.items():
        part, sides = f"8 cache {NAMES.get(workload, workload)}", r["sides"]
        oracle = sides["oracle"]
        same = {s: sides[s]["prompt_tokens"] == oracle["prompt_tokens"] for s in sides}
        for side, d in sides.items():
            note = (f"{d['cached_tokens']:,.0f} / {d['prompt_tokens']:,.0f} prompt tokens cached"
                    + ("" if same[side] else " (prompt tokens differ from the oracle's!)"))
            figures.append(Figure(part, f"{side}: hit share", d["hit_share"], "{:.3f}", note=note))
            figures.append(Figure(part, f"{side}: server tokens/s", d["throughput"]["tokens_per_s"], "{:,.0f}",
                                  note=f"requests per server {d['requests']}"))
        for side in SIDES[1:]:
            d = sides[side]
            hit = d["hit_share"] / oracle["hit_share"] if oracle["hit_share"] else None
            speed = d["throughput"]["tokens_per_s"] / oracle["throughput"]["tokens_per_s"]
            judged = side == "fleet"
            figures += [
                Figure(part, f"{side} / oracle: hit share", hit, "{:.3f}", goal=f">= {hit_goal}" if judged else "",
                       met=at_least(hit, hit_goal) if judged else None),
                Figure(part, f"{side} / oracle: throughput", speed, "{:.3f}",
                       goal=f">= {speed_goal}" if judged else "", met=at_least(speed, speed_goal) if judged else None),
                Figure(part, f"{side}: most loaded server / mean", d["balance"], "{:.3f}",
                       goal=f"<= {balance_goal}" if judged else "",
                       met=at_most(d["balance"], balance_goal) if judged else None,
                       note="output tokens per server; the oracle's " + f"{oracle['balance']:.3f}"),
            ]
        figures[-6].note = (f"{r['units']} {r.get('unit', workload)}, {r['requests']} requests; 4 servers, prefix cache "
                            f"{r['cache_tokens']:,} tokens each")
    return figures
