"""Real parts for every test: a Redis server, SGLang stand-ins and Celery workers as processes.

Two layers: `tests/specs/` holds in-process specifications (rules, routing,
parsing, codecs, the shard writer) that answer in seconds; every other test
drives real processes and is marked `slow`, so `pytest -m "not slow"` runs the
fast layer alone and a plain `pytest` runs everything.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis

from contract.keys import RunKeys
from contract.ledger.ledger import Ledger
from producer.local import Process, start_redis, start_standin, start_worker

from waiting import wait_until
from zygote import Command, Zygote

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "tests" / "specs"
REAL = ROOT / "tests" / "real"
# A real-server test's own limit: its servers start one at a time on the machine (tests/real_sglang.py),
# so its starts may wait for other tests' loads, each minutes on a loaded 2-core machine.
REAL_TIMEOUT = 1500


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups added here
def pytest_collection_modifyitems(items) -> None:
    """Mark the real-process tests slow; keep each spec module in one xdist worker (its module
    fixtures, a tokenizer or a redis-server, are built once, not once per worker); and run the
    slow tests first, so the short specs fill the end of a parallel run instead of one long
    test starting last (scripts/test.sh keeps this order: --no-loadscope-reorder); the real-server tests
    before all, since their groups are the longest runs of one worker (xdist hands the first units of
    work one to each worker, so each group starts at once, on a worker of its own)."""
    for item in items:
        if SPECS in Path(item.fspath).parents:
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(f"specs/{Path(item.fspath).stem}"))
        else:
            item.add_marker(pytest.mark.slow)
            if REAL in Path(item.fspath).parents and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(REAL_TIMEOUT))
    items.sort(key=lambda item: (SPECS in Path(item.fspath).parents, REAL not in Path(item.fspath).parents))


def pytest_collection_finish(session) -> None:
    """Refuse to run where xdist's groups would be ignored: its loadgroup suffixes a grouped test's
    id with `@group` in each worker, which pytest 9.2 no longer lets it do (the id is read-only); the
    real-server and spec groups would then run side by side (pyproject.toml pins pytest below 9)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    grouped = [item for item in session.items if item.get_closest_marker("xdist_group")]
    if grouped and "@" not in grouped[0].nodeid:
        pytest.exit(f"pytest {pytest.__version__} with this pytest-xdist ignores xdist_group under "
                    "--dist loadgroup: install the test extra's pytest (scripts/setup.sh)", returncode=4)


_zygote: list[Zygote] = []


def zygote() -> Zygote:
    """This pytest process's zygote (tests/zygote.py) for producer commands, stand-ins and workers,
    started when first used."""
    if not _zygote:
        _zygote.append(Zygote(Path(tempfile.mkdtemp(prefix="zygote-")), {**os.environ, "PYTHONPATH": str(ROOT)}, ROOT))
    return _zygote[0]


def pytest_sessionfinish() -> None:
    for started in _zygote:
        started.close()
    stop_shared_servers()
    stop_sglang_started_since(0)
    if "real_sglang" in sys.modules:  # the zygote the real servers were forked from, once none is left
        sys.modules["real_sglang"].close_launcher()


class Fleet:
    """Processes of one test, and the environment that binds them together."""

    def __init__(self, tmp: Path, redis_url: str):
        self.tmp, self.logs = tmp, tmp / "logs"
        self.redis_url = redis_url
        self.output_dir = tmp / "shards"
        self.processes: list[Process] = []
        self.servers: list = []  # real SGLang servers (tests/real_sglang.py), each a process group
        self._sglang_mark = _started_sglang_count()  # servers started from here on are this test's

    def env(self, **extra: str) -> dict[str, str]:
        base = {"REDIS_URL": self.redis_url, "OUTPUT_DIR": str(self.output_dir),
                "FLEET_SHARD_MAX_WAIT": "0.5", "FLEET_HEALTH_INTERVAL": "1", "FLEET_AUDIT_INTERVAL": "3",
                "PYTHONPATH": str(ROOT)}
        return {**os.environ, **base, **extra}

    def standin(self, *options: str, port: int | None = None, wait_healthy: bool = True) -> tuple[Process, str]:
        process, url = start_standin(self.logs, port, *options, wait_healthy=wait_healthy,
                                     launch=zygote().spawn)
        self.processes.append(process)
        return process, url

    def sglang(self, model: Path, *options: str, port: int | None = None, wait_healthy: bool = True):
        """The real SGLang server (tests/real_sglang.py) serving `model`, stopped with the test."""
        from real_sglang import start_sglang

        if _shared:  # a test's own server beside the shared ones: room made for it
            _shared[0].make_room(SHARED_SERVERS_ALIVE - 1)
        server = start_sglang(self.logs, model, *options, port=port, wait_healthy=wait_healthy)
        self.servers.append(server)
        return server

    def worker(self, name: str, servers: list[str], **extra: str) -> Process:
        env = self.env(SGLANG_URLS=",".join(servers), **extra)
        process = start_worker(self.logs, name, env, launch=zygote().spawn)
        self.processes.append(process)
        return process

    def producer(self, *args: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess:
        """`python -m producer ARGS` run to its end, forked from this worker's zygote (tests/zygote.py)."""
        result = zygote().run(list(args), self.env(**extra), ROOT, timeout=600)
        if check and result.returncode != 0:
            raise AssertionError(f"producer {args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def start_producer(self, *args: str, **extra: str) -> Command:
        """`python -m producer ARGS` started, not waited for (Popen's pid, communicate, returncode, kill)."""
        return zygote().start("producer", list(args), self.env(**extra), ROOT)

    def dead_letters(self, run: str = "default") -> list[dict]:
        return json.loads(self.producer("dead", "list", "--json", "--run", run).stdout)

    def states(self, run: str = "default") -> dict[str, int]:
        """Prompts of the run by state, counted from the ledger's own entries."""
        return Ledger(redis.Redis.from_url(self.redis_url), run).counts()

    def counters(self, run: str = "default") -> dict[str, int]:
        raw = redis.Redis.from_url(self.redis_url).hgetall(RunKeys(run).counters)
        return {k.decode(): int(v) for k, v in raw.items()}

    def wait_finished(self, run: str = "default", timeout: float = 240) -> dict:
        """Until no prompt of the run is pending; returns the ledger's states. Each look reads
        every entry of the run (25 ms of CPU for 2,000 prompts), so it looks once per poll, and
        twice a second: a run's last prompt is never waited for by more than half a second."""
        seen: dict[str, int] = {}

        def finished() -> bool:
            seen.clear()
            seen.update(self.states(run))
            return bool(seen) and "queued" not in seen

        wait_until(finished, timeout, f"run {run} finished", self, poll=0.5)
        return dict(seen)

    def logs_tail(self, lines: int = 30) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail(lines)}" for p in self.processes)

    def rows(self, run: str = "default") -> list[dict]:
        """Every stored sample, read straight from the Parquet shards."""
        folder = self.output_dir / run
        files = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))
        return [row for f in files for row in pq.read_table(f).to_pylist()]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(timeout=20)
        for server in self.servers:
            server.stop()
        stop_sglang_started_since(self._sglang_mark)


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,1000"]


@pytest.fixture
def browser(tmp_path: Path):
    """Headless Debian Chromium through its own chromedriver (Selenium Manager never runs),
    keeping the page's console log."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):  # a missing browser fails, never skips
        pytest.fail(f"Chromium not found ({CHROMIUM}, {CHROMEDRIVER}): run scripts/install-browser.sh")
    from selenium import webdriver  # installed with the browser by scripts/install-browser.sh
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()


@pytest.fixture
def redis_server(tmp_path: Path):
    process, url = start_redis(tmp_path / "logs")
    yield url
    process.stop()


@pytest.fixture
def fleet(tmp_path: Path, redis_server: str):
    f = Fleet(tmp_path, redis_server)
    yield f
    f.stop()


@pytest.fixture(scope="session")
def tokenizer():
    """The real tokenizer, loaded by transformers directly (not through the producer)."""
    from transformers import AutoTokenizer

    from contract.chat.bundled import bundled_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir()))


@pytest.fixture(scope="session")
def sglang_models(tokenizer) -> dict[str, Path]:
    """The real server's tiny checkpoints (tests/real_sglang.py), built once into the cache."""
    from contract.chat.bundled import bundled_tokenizer_dir
    from real_sglang import checkpoint

    return {kind: checkpoint(kind, bundled_tokenizer_dir(), tokenizer) for kind in ("random", "trace")}


# Real servers one pytest process keeps between its tests (~2.7 GB each): with the two groups whose servers
# die, one each, four at most on the machine (tests/real_sglang.SERVER_SLOTS).
SHARED_SERVERS_ALIVE = 2
_shared: list = []


def shared_servers():
    """This pytest process's real servers shared between its tests (tests/real_sglang.SharedServers)."""
    if not _shared:
        from real_sglang import SharedServers

        _shared.append(SharedServers(Path(tempfile.mkdtemp(prefix="sglang-shared-")), SHARED_SERVERS_ALIVE))
    return _shared[0]


def stop_shared_servers() -> None:
    if _shared:
        _shared[0].stop_all()


@pytest.fixture
def shared_sglang(sglang_models):
    """`shared_sglang(kind, *options, copy=0)`: the real server of a checkpoint (`random` or `trace`) with
    SGLang's `options`, kept alive for the tests after this one that ask for the same (the tests of an xdist
    group run in one pytest process, one after another); started again if a test left it dead."""
    def get(kind: str, *options: str, copy: int = 0):
        return shared_servers().get(sglang_models[kind], *options, copy=copy)
    return get


def _started_sglang_count() -> int:
    import real_sglang

    return len(real_sglang.STARTED)


def stop_sglang_started_since(mark: int) -> None:
    """Every real server started since `mark` but the shared ones, alive or not (a restart cut short by a
    timeout, a supervisor's last restart): none outlives its test."""
    import real_sglang

    for server in real_sglang.STARTED[mark:]:
        if _shared and _shared[0].holds(server):
            continue
        if server.process.popen.poll() is None:
            server.stop()
        else:
            server.bury()  # its launcher gone: whatever of its group is left


def render(tokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def write_prompts(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def varied_prompts(n: int, prefix: str = "p") -> list[dict]:
    """n prompts in the three input forms, with system turns and multi-turn chats."""
    records = []
    for i in range(n):
        pid = f"{prefix}-{i:04d}"
        text = f"Question {i}: what is {i} * {i + 7}? Explain step by step." + " Détails ✓" * (i % 5)
        if i % 3 == 0:
            records.append({"id": pid, "prompt": text})
        elif i % 3 == 1:
            messages = [{"role": "user", "content": text}]
            if i % 2:
                messages.insert(0, {"role": "system", "content": "You are a careful tutor."})
            records.append({"id": pid, "messages": messages})
        else:
            records.append({"id": pid, "conversations": [
                {"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hi! How can I help?"},
                {"from": "human", "value": text}]})
    return records


def messages_of(record: dict) -> list[dict]:
    """The test's own reading of the three input forms."""
    if "messages" in record:
        return record["messages"]
    if "prompt" in record:
        return [{"role": "user", "content": record["prompt"]}]
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    return [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]
