"""Which HTTP client should the worker threads use? CPU per request vs threads in flight.

`python -m bench.http_clients` starts one instant SGLang stand-in (no modelled
time, a batch limit above any thread count, ~100-token outputs) and, for each
candidate client and each thread count N, runs a fresh child process in which
N threads post `/generate` in a loop, each request the body the worker sends
(`input_ids` of ~300 ints, `sampling_params`, a unique `rid`, `stream: false`)
and each answer decoded to a dict. The child's own CPU (`time.process_time()`,
every thread) is read over a window in the steady state: after a warm-up in
which every thread has finished one request (so connections exist), until
`--requests` more have finished or `--seconds` have passed, whichever is first.
The child then exits at once (`os._exit`): requests still in flight are
abandoned rather than drained, so a slow client cannot stretch the run.

Every candidate sends the same pre-encoded bytes (`json.dumps`, compact) and
decodes the raw body with the same `json.loads`, so encode/decode weigh alike;
the decode alone is timed separately (and `orjson`'s, when importable).

Candidates (`--clients`, comma-separated; a candidate whose package is not
importable is reported as skipped):
  httpx-shared         one `httpx.Client` for all threads (the worker's today)
  httpx-per-thread     one `httpx.Client` per thread (thread-local, 1 connection)
  requests-per-thread  one `requests.Session` per thread (needs `requests`)
  urllib3-shared       one `urllib3.PoolManager` (its pool is a LIFO queue)
  worker               the worker's own call (`workers.servers.sglang_client.send`): one
                       pool of keep-alive sockets per server (`workers/servers/http1.py`,
                       HTTP/1.1 on a bare socket), a total deadline per request (a
                       watchdog thread shuts the socket of a request past it),
                       the body read under a size cap (urllib3 until 2026-12-04), the
                       answer parsed by llhttp (`httptools`; a parser of our own until 2027-01)
  parse-httptools      the worker's pool and watchdog, the answer parsed by llhttp
  parse-h11            the same, the request written and the answer parsed by `h11`
                       (`bench/http_parsers.py`; `python -m bench --parts http`)
  asyncio-httpx        one event-loop thread with one `httpx.AsyncClient`,
                       bridged with `asyncio.run_coroutine_threadsafe`
  asyncio-httpx-lanes  the same loop, but a LIFO stack of one-connection
                       `httpx.AsyncClient`s instead of one shared pool
  httpx2-shared        one `httpx2.Client` (pydantic's fork; in the venv only
                       as a dependency of huggingface_hub)

`--extra-site DIR` appends a site-packages folder of the same interpreter to
`sys.path` (after the venv's), to try `requests` or `orjson` from the system
Python without installing them into the project's venv.

Loopback only, bounded: each (client, N) child is killed after
`--warmup-seconds + --seconds + 90` s at the latest (a child whose main thread is
starved of the GIL overshoots both; it is then reported as killed).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .procs import cpu_seconds

CLIENTS = ("httpx-shared", "httpx-per-thread", "requests-per-thread", "urllib3-shared",
           "worker", "parse-httptools", "parse-h11", "asyncio-httpx", "asyncio-httpx-lanes", "httpx2-shared")
INSTANT = ["--step-base", "0", "--step-per-request", "0", "--prefill-per-token", "0"]
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0     # per socket read (httpx, requests, urllib3); the worker's request timeout
TOTAL_DEADLINE = 900.0   # whole request, where the client can enforce one
HEADERS = {"Content-Type": "application/json"}


# --------------------------------------------------------------------------------------------
# The request body and the one decode every candidate uses.

def encode(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def decode(raw: bytes) -> dict:
    data = json.loads(raw)
    if isinstance(data, list):
        data = data[0]
    return data


def sampling(output_len_max: int) -> dict:
    return {"max_new_tokens": output_len_max + 64, "temperature": 0.6, "top_p": 0.95,
            "skip_special_tokens": False}


# --------------------------------------------------------------------------------------------
# Candidates: each returns post(url, body_bytes) -> (status, raw_bytes), safe to call from any thread.

def make_candidate(name: str, n: int):
    if name in ("httpx-shared", "httpx2-shared"):
        httpx = __import__("httpx" if name == "httpx-shared" else "httpx2")
        client = httpx.Client(  # as workers/servers/sglang_client.make_client, pool_size = N
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=READ_TIMEOUT),
            limits=httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8))

        def post(url, body):
            r = client.post(url, content=body, headers=HEADERS)
            return r.status_code, r.content
        return post

    if name == "httpx-per-thread":
        import httpx
        ssl_context = httpx.create_ssl_context()  # one CA bundle load, not one per thread
        local = threading.local()

        def post(url, body):
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = httpx.Client(
                    verify=ssl_context,
                    timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=READ_TIMEOUT),
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
            r = client.post(url, content=body, headers=HEADERS)
            return r.status_code, r.content
        return post

    if name == "requests-per-thread":
        import requests
        from requests.adapters import HTTPAdapter
        local = threading.local()

        def post(url, body):
            session = getattr(local, "session", None)
            if session is None:
                session = local.session = requests.Session()
                session.trust_env = False  # else proxies and ~/.netrc are looked up per request
                adapter = HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
                session.mount("http://", adapter)
                session.mount("https://", adapter)
            r = session.post(url, data=body, headers=HEADERS, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT))
            return r.status_code, r.content
        return post

    if name == "urllib3-shared":
        import urllib3
        manager = urllib3.PoolManager(num_pools=16, maxsize=n + 8, block=False, retries=False,
                                      timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT))

        def post(url, body):
            r = manager.request("POST", url, body=body, headers=HEADERS)
            return r.status, r.data
        return post

    if name == "worker":  # the worker's own call: workers/servers/sglang_client.send
        from workers.servers.sglang_client import make_client, send
        client = make_client(n, CONNECT_TIMEOUT, READ_TIMEOUT, None)

        def post(url, body):
            r = send(client, url, body, timeout=TOTAL_DEADLINE, max_bytes=1 << 24)
            return r.status, r.body
        return post

    if name in ("parse-httptools", "parse-h11"):
        from .http_parsers import make_parser_candidate
        return make_parser_candidate(name, n, CONNECT_TIMEOUT, READ_TIMEOUT, TOTAL_DEADLINE)

    if name in ("asyncio-httpx", "asyncio-httpx-lanes"):
        import asyncio

        import httpx
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="http-loop", daemon=True).start()
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, pool=READ_TIMEOUT)
        ssl_context = httpx.create_ssl_context()
        lanes = name == "asyncio-httpx-lanes"

        async def make_shared():
            return httpx.AsyncClient(timeout=timeout, verify=ssl_context, limits=httpx.Limits(
                max_connections=n + 8, max_keepalive_connections=n + 8))
        shared = None if lanes else asyncio.run_coroutine_threadsafe(make_shared(), loop).result()
        idle: list = []  # lanes: LIFO stack of one-connection clients, touched in the loop only
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)

        async def once(url, body):
            if shared is not None:
                r = await shared.post(url, content=body, headers=HEADERS)
                return r.status_code, r.content
            client = idle.pop() if idle else httpx.AsyncClient(timeout=timeout, verify=ssl_context, limits=one)
            try:
                r = await client.post(url, content=body, headers=HEADERS)
            finally:
                idle.append(client)
            return r.status_code, r.content

        async def call(url, body):  # a real deadline: the whole request, however the bytes come
            if hasattr(asyncio, "timeout"):  # Python 3.11+
                async with asyncio.timeout(TOTAL_DEADLINE):
                    return await once(url, body)
            return await asyncio.wait_for(once(url, body), TOTAL_DEADLINE)

        def post(url, body):
            return asyncio.run_coroutine_threadsafe(call(url, body), loop).result()
        return post

    raise ValueError(f"unknown client {name!r}")


def importable(name: str) -> str | None:
    """None if the candidate can run, else why not."""
    module = {"requests-per-thread": "requests", "httpx2-shared": "httpx2"}.get(name)
    if name.startswith("urllib3"):
        module = "urllib3"
    if name == "worker":
        module = "workers.servers.sglang_client"
    if name.startswith("parse-"):
        module = name[len("parse-"):]
    if module is None:
        module = "httpx"
    try:
        __import__(module)
    except ImportError:
        return f"{module} not installed"
    return None


# --------------------------------------------------------------------------------------------
# The child: N threads in a loop, CPU over a steady-state window.

def _proc_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return float("nan")


def _open_tcp() -> int:
    """Sockets this process holds (a proxy for connections)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


def child(args: argparse.Namespace) -> dict:
    n = args.n
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    post = make_candidate(args.child, n)
    url = f"{args.url}/generate"
    params = sampling(args.output_len_max)
    done = [0] * n
    errors = [0] * n
    first_error: list[str] = []
    stop = threading.Event()

    go = threading.Event()

    def run(i: int) -> None:
        rng = random.Random(i)
        ids = [rng.randrange(1000, 100_000) for _ in range(args.prompt_len)]
        k = 0
        go.wait()
        while not stop.is_set():
            k += 1
            body = encode({"input_ids": ids, "sampling_params": params,
                           "rid": f"hc-{os.getpid()}-{i}-{k}", "stream": False})
            try:
                status, raw = post(url, body)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
                data = decode(raw)
                if not data["output_ids"]:
                    raise RuntimeError("empty output_ids")
                done[i] += 1
            except Exception as exc:  # counted, and the first one shown
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{exc.__class__.__name__}: {exc}"[:300])
                time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:  # all started before any request, so starting is not slowed by them
        t.start()
    started = time.monotonic()
    go.set()
    warm_until = started + args.warmup_seconds
    while time.monotonic() < warm_until and min(done) < 1:
        time.sleep(0.02)
    warm = sum(1 for d in done if d) / n
    # One straight run of C calls: no switch of the GIL between the clock, the CPU and the counts
    # (reading /proc for the server's CPU does release it, so that one has its own clock).
    snap = lambda: (time.monotonic(), time.process_time(), os.times(), sum(done), sum(errors))  # noqa: E731
    t0, cpu0, times0, c0, e0 = snap()
    st0, scpu0 = time.monotonic(), _proc_cpu(args.server_pid)
    end = t0 + args.seconds
    while time.monotonic() < end and sum(done) - c0 < args.requests:
        time.sleep(0.01)
    t1, cpu1, times1, c1, e1 = snap()
    st1, scpu1 = time.monotonic(), _proc_cpu(args.server_pid)
    server_cpu = (scpu1 - scpu0) / (st1 - st0) * (t1 - t0)  # its CPU rate over the same window
    sockets = _open_tcp()
    stop.set()
    count = c1 - c0
    return {
        "client": args.child, "n": n, "requests": count, "errors": e1 - e0,
        "first_error": first_error[0] if first_error else "",
        "cpu_s": cpu1 - cpu0, "wall_s": t1 - t0,
        "sys_share": (times1.system - times0.system) / (cpu1 - cpu0) if cpu1 > cpu0 else None,
        "cpu_us_per_request": (cpu1 - cpu0) / count * 1e6 if count else None,
        "server_us_per_request": server_cpu / count * 1e6 if count else None,
        "requests_per_s": count / (t1 - t0) if t1 > t0 else None,
        "warm_share": warm, "warmup_s": t0 - started, "sockets": sockets,
        "peak_rss_mib": _peak_rss_mib(),
    }


def _peak_rss_mib() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------
# The parent: stand-in, decode cost, one child per (client, N), the table.

def decode_costs(url: str, args: argparse.Namespace) -> dict:
    """Encode and decode alone, per request: the real ~100-token answer, and the same answer
    with 4,000 output ids (the fleet's typical reasoning length)."""
    import httpx
    payload = {"input_ids": list(range(1000, 1000 + args.prompt_len)),
               "sampling_params": sampling(args.output_len_max), "rid": "hc-decode", "stream": False}
    raw = httpx.post(f"{url}/generate", content=encode(payload), headers=HEADERS, timeout=30).content
    answer = decode(raw)
    big = dict(answer, output_ids=[random.randrange(1000, 100_000) for _ in range(4000)])
    big["text"] = " ".join(f"t{i}" for i in big["output_ids"])
    bodies = {"": raw, "_4000": encode(big)}
    out = {"request_bytes": len(encode(payload)), "response_bytes": len(raw),
           "response_bytes_4000": len(bodies["_4000"]), "output_tokens": len(answer["output_ids"])}

    def per_call(fn, arg, loops: int = 2000) -> float:
        t = time.process_time()
        for _ in range(loops):
            fn(arg)
        return (time.process_time() - t) / loops * 1e6

    out["json_dumps_request_us"] = per_call(encode, payload)
    try:
        import orjson
        out["orjson_version"] = orjson.__version__
    except ImportError:
        orjson = None
        out["orjson_version"] = None
    for suffix, body in bodies.items():
        out[f"json_loads_us{suffix}"] = per_call(json.loads, body, 2000 if not suffix else 200)
        if orjson is not None:
            out[f"orjson_loads_us{suffix}"] = per_call(orjson.loads, body, 2000 if not suffix else 200)
    return out


def describe_decode(costs: dict) -> str:
    def one(suffix: str) -> str:
        text = f"json.loads {costs[f'json_loads_us{suffix}']:.1f} us"
        if costs["orjson_version"]:
            text += f", orjson.loads {costs[f'orjson_loads_us{suffix}']:.1f} us"
        return text
    return (f"request {costs['request_bytes']} B, json.dumps {costs['json_dumps_request_us']:.1f} us; "
            f"response {costs['response_bytes']} B ({costs['output_tokens']} output ids): {one('')}; "
            f"same with 4,000 output ids ({costs['response_bytes_4000']} B): {one('_4000')}; orjson "
            + (f"{costs['orjson_version']} importable" if costs["orjson_version"] else "not installed"))


def run_child(client: str, n: int, url: str, server_pid: int, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "bench.http_clients", "--child", client, "--n", str(n),
            "--url", url, "--server-pid", str(server_pid),
            "--requests", str(args.requests), "--seconds", str(args.seconds),
            "--warmup-seconds", str(args.warmup_seconds), "--prompt-len", str(args.prompt_len),
            "--output-len-max", str(args.output_len_max), "--switch-interval", str(args.switch_interval)]
    for site in args.extra_site:
        argv += ["--extra-site", site]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    limit = args.warmup_seconds + args.seconds + 90  # a starved child overshoots both
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root,
                            start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"client": client, "n": n, "failed": f"killed after {limit:.0f}s"}
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"client": client, "n": n, "failed": f"exit {proc.returncode}: {err.strip()[-500:]}"}


def _fmt(value, spec: str) -> str:
    if value is None:
        width = re.match(r"\d*", spec).group()
        return format("n/a", f">{width}") if width else "n/a"
    return format(value, spec)


def _spread(r: dict) -> str:
    lo, hi = r.get("cpu_us_spread") or (None, None)
    return "-" if lo is None or r.get("runs", 1) < 2 else f"{lo:.0f}-{hi:.0f}"


def print_tables(results: list[dict], threads: list[int]) -> None:
    print()
    head = (f"{'client':<20} {'N':>5} {'requests':>8} {'CPU us/req':>10} {'req/s':>7} "
            f"{'min-max':>11} {'srv us/req':>10} {'sys%':>5} {'sockets':>7} {'RSS MiB':>7} {'warm':>5} {'errors':>6}")
    print(head)
    print("-" * len(head))
    for r in results:
        if "failed" in r or "skipped" in r:
            print(f"{r['client']:<20} {r['n']:>5} {r.get('skipped') or r.get('failed')}")
            continue
        print(f"{r['client']:<20} {r['n']:>5} {r['requests']:>8} {_fmt(r['cpu_us_per_request'], '10.0f')} "
              f"{_fmt(r['requests_per_s'], '7.0f')} {_spread(r):>11} {_fmt(r['server_us_per_request'], '10.0f')} "
              f"{_fmt(r['sys_share'] and r['sys_share'] * 100, '5.0f')} "
              f"{r['sockets']:>7} {r['peak_rss_mib']:>7.0f} {r['warm_share']:>5.0%} {r['errors']:>6}")
    print()
    lo, hi = min(threads), max(threads)
    ns = sorted(threads)
    print(f"{'client':<20} " + " ".join(f"{'CPU@' + str(n):>10}" for n in ns)
          + f" {'ratio':>7}   (CPU us/request; ratio = N={hi} / N={lo})")
    by = {(r["client"], r["n"]): r.get("cpu_us_per_request") for r in results}
    for client in dict.fromkeys(r["client"] for r in results):
        a, b = by.get((client, lo)), by.get((client, hi))
        ratio = b / a if a and b else None
        print(f"{client:<20} " + " ".join(_fmt(by.get((client, n)), "10.0f") for n in ns)
              + f" {_fmt(ratio, '7.2f')}")
    for r in results:
        if r.get("failed_runs") and "cpu_us_per_request" in r:
            print(f"  {r['client']} N={r['n']}: {len(r['failed_runs'])} of {r['runs']} runs failed "
                  f"({'; '.join(r['failed_runs'])}); shown: the others")
        if r.get("first_error"):
            print(f"  {r['client']} N={r['n']}: {r['errors']} errors in the window; first error "
                  f"(warm-up included): {r['first_error']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.http_clients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset")
    p.add_argument("--threads", default="16,256,2048", help="comma-separated thread counts N")
    p.add_argument("--requests", type=int, default=4000, help="requests per window at most")
    p.add_argument("--seconds", type=float, default=5.0, help="window length at most")
    p.add_argument("--warmup-seconds", type=float, default=10.0,
                   help="at most this long for every thread to finish its first request")
    p.add_argument("--prompt-len", type=int, default=300, help="input_ids per request")
    p.add_argument("--output-len", type=float, default=100, help="output tokens per answer (median)")
    p.add_argument("--output-len-max", type=int, default=110)
    p.add_argument("--extra-site", action="append", default=[],
                   help="append this site-packages folder to sys.path (e.g. for requests, orjson)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per configuration; the lower median is shown, with the spread")
    p.add_argument("--switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval in each child (0: Python's default, 0.005 s)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the stand-in's log folder")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.extend(args.extra_site)
    if args.child:
        result = child(args)
        print(json.dumps(result), flush=True)
        os._exit(0)  # abandon in-flight requests: no drain, no joins

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    for c in clients:
        if c not in CLIENTS:
            raise SystemExit(f"unknown client {c!r}; choose from {', '.join(CLIENTS)}")
    d = measure(args, lambda message: print(message, flush=True))
    print_tables(d["results"], d["threads"])
    print(f"load average (1 min) during the run: {min(d['load_average']):.1f} to {max(d['load_average']):.1f} "
          f"on {os.cpu_count()} CPUs (other people's work shares them)")
    if args.json:
        args.json.write_text(json.dumps({**d, "options": vars(args)}, indent=2, default=str) + "\n")
    return 0


def measure(args: argparse.Namespace, log) -> dict:
    """One stand-in; each client at each N, `--repeat` times round; the runs and their medians."""
    import httpx
    import urllib3

    from producer.local import start_standin

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    threads = [int(t) for t in args.threads.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="http-clients-"))
    options = ["--log-level", "warning", *INSTANT, "--max-running-requests", str(max(threads) * 2 + 64),
               "--output-len-median", str(args.output_len), "--output-len-sigma", "0.01",
               "--output-len-max", str(args.output_len_max), "--health-latency", "0"]
    standin, url = start_standin(logs, None, *options)
    versions = {"python": sys.version.split()[0], "httpx": httpx.__version__, "urllib3": urllib3.__version__}
    for module in ("httpcore", "requests", "httpx2", "aiohttp", "httptools", "h11"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    runs: dict[tuple[str, int], list[dict]] = {}
    load = [os.getloadavg()[0]]
    try:
        costs = decode_costs(url, args)
        log(f"versions: {versions}")
        log(f"stand-in: {url} ({' '.join(options)}); its log in {logs}"
            + ("" if args.keep else " (removed at the end; --keep keeps it)"))
        log(describe_decode(costs))
        log(f"window: up to {args.requests} requests or {args.seconds:g} s after a warm-up of up to "
            f"{args.warmup_seconds:g} s; CPU = time.process_time() of the client process; "
            f"{args.repeat} run(s) each, the lower median shown (with 2 runs: the better one); "
            f"load average now {load[0]:.1f}")
        for _ in range(args.repeat):  # repeats go round every configuration, to spread the noise
            for client in clients:
                why = importable(client)
                for n in threads:
                    if why:
                        runs.setdefault((client, n), []).append(
                            {"client": client, "n": n, "skipped": f"skipped: {why}"})
                        continue
                    result = run_child(client, n, url, standin.popen.pid, args)
                    runs.setdefault((client, n), []).append(result)
                    if "failed" in result:
                        log(f"  {client} N={n}: {result['failed']}")
                    else:
                        log(f"  {client:<20} N={n:<5} {result['requests']:>6} req  "
                            f"{_fmt(result['cpu_us_per_request'], '8.0f')} us/req  "
                            f"{_fmt(result['requests_per_s'], '6.0f')} req/s  warm {result['warm_share']:.0%}  "
                            f"load {os.getloadavg()[0]:.1f}")
                    load.append(os.getloadavg()[0])
                    if not standin.alive():
                        raise RuntimeError(f"stand-in died:\n{standin.tail()}")
                    time.sleep(0.5)  # let the stand-in drop the abandoned connections
    finally:
        standin.stop(timeout=10)
    if not args.keep:
        shutil.rmtree(logs, ignore_errors=True)
    return {"versions": versions, "decode": costs, "threads": threads, "load_average": load,
            "results": [_median(found) for found in runs.values()], "runs": list(runs.values())}


def _median(found: list[dict]) -> dict:
    """The run with the (lower) median CPU per request, with the spread over all runs.

    Other people's work on a shared machine only ever adds CPU, so with two runs the
    better one is the better estimate; the spread shows how far apart they were."""
    good = sorted((r for r in found if r.get("cpu_us_per_request")), key=lambda r: r["cpu_us_per_request"])
    if not good:
        return found[-1]
    pick = dict(good[(len(good) - 1) // 2])
    pick["runs"] = len(found)
    pick["failed_runs"] = [r["failed"] for r in found if "failed" in r]
    pick["cpu_us_spread"] = [good[0]["cpu_us_per_request"], good[-1]["cpu_us_per_request"]]
    return pick


if __name__ == "__main__":
    sys.exit(main())
