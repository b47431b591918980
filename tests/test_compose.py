"""Specs for compose/: every Compose file renders, and the stack keeps the fleet's rules.

Each spec reads given / when / then.

Rendering prefers the real tool: `docker compose config` (v2) or `docker-compose
config` (v1 or v2; Debian: `apt-get install -y docker-compose`). It runs with a
clean environment and an explicit `--env-file`, so neither the shell nor a local
compose/.env leaks in. Without either tool, the file is parsed with PyYAML and
interpolated here the way Compose does it (`${VAR}`, `${VAR:-d}`, `${VAR-d}`,
`${VAR:?e}`, `$$`). The specs skip only when neither is available.

Where a rule is about behaviour, it is checked against real processes: the
rendered Redis command line runs on a real redis-server, and the healthchecks run
against a real Redis and a real SGLang stand-in that is warming up (503) or
ready (200, empty body).
"""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.specs.image_pins import why_unpinned

try:
    import yaml
except ImportError:  # the tool with JSON output still works without it
    yaml = None

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILES = sorted(p for p in COMPOSE_DIR.iterdir()
                       if re.fullmatch(r"(docker-)?compose(\.[\w-]+)?\.ya?ml", p.name))
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
PROFILES = ("gpu", "standin")
PROFILED_SERVERS = {"gpu": "sglang", "standin": "standin"}
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


# --------------------------------------------------------------------------- env


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    return values


EXAMPLE = read_env_file(ENV_EXAMPLE)
ENV_CASES = {
    "example": EXAMPLE,                      # what a user starts from
    "empty": {},                             # nothing set: every default
    "exposed": {**EXAMPLE, "REDIS_HOST_IP": "0.0.0.0", "FLOWER_HOST_IP": "0.0.0.0"},
}


# --------------------------------------------------------------------------- rendering


@functools.lru_cache(maxsize=1)
def compose_tool() -> tuple[tuple[str, ...], bool] | None:
    """(argv prefix, speaks --format json) of the first Compose CLI that runs here."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(("docker", "compose"))
    if shutil.which("docker-compose"):
        candidates.append(("docker-compose",))
    for argv in candidates:
        try:
            done = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return argv, bool(re.search(r"version v?2\.", done.stdout))
    return None


def renderer() -> str:
    if compose_tool() is not None and (compose_tool()[1] or yaml is not None):
        return "tool"
    if yaml is not None:
        return "parser"
    pytest.skip("neither a Compose CLI (`docker compose` or `docker-compose`, e.g. "
                "`apt-get install -y docker-compose`) nor PyYAML is available")


@dataclass(frozen=True)
class Rendered:
    """One Compose file rendered for one profile and one env file."""
    services: dict        # the services that profile starts
    all_services: dict
    volumes: dict
    warnings: str
    via: str

    def service(self, name: str) -> dict:
        assert name in self.services, f"no service {name!r} in this profile"
        return self.services[name]


@functools.lru_cache(maxsize=None)
def render(file: Path, profile: str, env_case: str) -> Rendered:
    env = ENV_CASES[env_case]
    if renderer() == "tool":
        config, warnings = _render_with_tool(file, profile, env)
    else:
        config, warnings = _render_with_parser(file, env)
    assert isinstance(config.get("services"), dict) and config["services"], "no services"
    services = {name: svc for name, svc in config["services"].items()
                if not svc.get("profiles") or profile in svc["profiles"]}
    return Rendered(services, config["services"], config.get("volumes") or {}, warnings, renderer())


def _render_with_tool(file: Path, profile: str, env: dict[str, str]) -> tuple[dict, str]:
    argv, speaks_json = compose_tool()
    with tempfile.NamedTemporaryFile("w", suffix=".env", delete=False) as handle:
        handle.write("".join(f"{k}={v}\n" for k, v in env.items()))
    env_file = Path(handle.name)
    try:
        cmd = [*argv, "-f", str(file), "--env-file", str(env_file), "--profile", profile, "config"]
        if speaks_json:
            cmd += ["--format", "json"]
        clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=clean)
    finally:
        env_file.unlink(missing_ok=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    config = json.loads(done.stdout) if speaks_json else yaml.safe_load(done.stdout)
    return config, done.stderr


_INTERPOLATION = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_]\w*))")
_TOP_LEVEL = {"version", "name", "services", "networks", "volumes", "configs", "secrets"}


def _render_with_parser(file: Path, env: dict[str, str]) -> tuple[dict, str]:
    """PyYAML plus Compose's interpolation rules; `$$` stays escaped as the CLI prints it."""
    raw = yaml.safe_load(file.read_text())
    assert isinstance(raw, dict), f"{file.name}: not a mapping"
    unknown = {k for k in raw if k not in _TOP_LEVEL and not k.startswith("x-")}
    assert not unknown, f"{file.name}: unknown top-level keys {sorted(unknown)}"
    warnings: list[str] = []

    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$$"
        if match["named"]:
            name, op, arg = match["named"], None, None
        else:
            parts = re.fullmatch(r"([A-Za-z_]\w*)(?:(:?[-?])(.*))?", match["braced"], re.S)
            assert parts, f"{file.name}: invalid interpolation ${{{match['braced']}}}"
            name, op, arg = parts.groups()
        value = env.get(name)
        if op is None:
            if value is None:
                warnings.append(f'The "{name}" variable is not set. Defaulting to a blank string.')
            return value or ""
        if op in (":-", "-"):
            return value if (value if op == ":-" else value is not None) else arg
        if not (value if op == ":?" else value is not None):
            raise AssertionError(f"required variable {name} is missing: {arg}")
        return value

    def walk(node):
        if isinstance(node, str):
            return _INTERPOLATION.sub(substitute, node)
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        return node

    return walk(raw), "\n".join(warnings)


# --------------------------------------------------------------------------- normalizing


def argv_of(value) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def env_of(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return env


def ports_of(service: dict) -> list[tuple[str, str, str]]:
    """(host ip, published port, target port) of every published port."""
    out = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.append((port.get("host_ip") or "0.0.0.0", str(port.get("published") or ""),
                        str(port["target"])))
            continue
        parts = str(port).split("/")[0].split(":")
        if len(parts) == 3:
            out.append((parts[0] or "0.0.0.0", parts[1], parts[2]))
        elif len(parts) == 2:
            out.append(("0.0.0.0", parts[0], parts[1]))
        else:
            out.append(("0.0.0.0", "", parts[0]))
    return out


def seconds(value) -> float:
    """Compose durations: '1800s', '30m', '30m0s', '1h2m3.5s', or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    pieces = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", value)
    assert pieces and "".join(n + u for n, u in pieces) == value, f"not a duration: {value!r}"
    return sum(float(n) * units[u] for n, u in pieces)


def healthcheck_argv(service: dict) -> list[str]:
    """The healthcheck as an argv (CMD-SHELL becomes sh -c), with Compose's `$$` unescaped."""
    test = (service.get("healthcheck") or {}).get("test")
    assert test, "no healthcheck"
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    kind, rest = test[0], [t.replace("$$", "$") for t in test[1:]]
    assert kind in ("CMD", "CMD-SHELL"), f"healthcheck test kind {kind!r}"
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


def volume_targets(service: dict) -> list[str]:
    targets = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            targets.append(volume["target"])
        else:
            targets.append(volume.split(":")[1] if ":" in volume else volume)
    return targets


def option(argv: list[str], flag: str) -> str | None:
    """The value after `flag` (or in `flag=value`), None if absent."""
    for i, word in enumerate(argv):
        if word == flag:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def shutdown_grace(worker_env: dict) -> float:
    """How long a worker drains on SIGTERM (FLEET_SHUTDOWN_GRACE), 0 where workers lack it."""
    if worker_env.get("FLEET_SHUTDOWN_GRACE"):
        return float(worker_env["FLEET_SHUTDOWN_GRACE"])
    from workers.settings import Settings
    field = Settings.model_fields.get("shutdown_grace")
    return float(field.default) if field is not None else 0.0


def redis_password(url: str) -> str:
    from urllib.parse import unquote, urlsplit
    return unquote(urlsplit(url).password or "")


# --------------------------------------------------------------------------- parameters

files = pytest.mark.parametrize("file", COMPOSE_FILES, ids=lambda p: p.name)
profiles = pytest.mark.parametrize("profile", PROFILES)
env_cases = pytest.mark.parametrize("env_case", sorted(ENV_CASES))


def test_the_compose_directory_holds_a_compose_file():
    """Given compose/, then it holds the stack's Compose file (the specs below need one)."""
    assert COMPOSE_DIR / "docker-compose.yml" in COMPOSE_FILES


# --------------------------------------------------------------------------- the whole file


@files
@profiles
@env_cases
def test_every_compose_file_renders_for_each_profile(file, profile, env_case):
    """Given a Compose file and an env file (the example, none, or one exposing ports),
    when it is rendered for the gpu or the standin profile,
    then it is valid, starts the core services plus only that profile's server,
    and needs no variable the user left unset."""
    rendered = render(file, profile, env_case)
    assert {"redis", "worker", "flower"} <= set(rendered.services)
    for other, server in PROFILED_SERVERS.items():
        assert (server in rendered.services) == (other == profile), server
    assert "is not set" not in rendered.warnings, rendered.warnings


@files
def test_every_service_has_an_image_or_a_build(file):
    """Given every service of every profile, then Compose knows how to get its image."""
    for name, service in render(file, "gpu", "example").all_services.items():
        assert service.get("image") or service.get("build"), name


@files
@env_cases
def test_every_image_is_pinned_to_a_tested_version(file, env_case):
    """Given every service of every profile, then its image is never :latest or untagged, and
    SGLang's and the fleet's are the versions the fleet is tested with (tests/specs/image_pins.py)."""
    images = {name: service["image"] for name, service in render(file, "gpu", env_case).all_services.items()
              if service.get("image")}
    assert {"sglang", "worker"} <= set(images)
    assert [why for why in map(why_unpinned, images.values()) if why] == []


@files
def test_builds_use_the_project_dockerfile_from_the_repository_root(file):
    """Given a service built from source, then it builds this repository with compose/Dockerfile."""
    for name, service in render(file, "standin", "example").all_services.items():
        build = service.get("build")
        if not build:
            continue
        build = {"context": build} if isinstance(build, str) else build
        context = (file.parent / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context}"
        assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_dockerfile_installs_the_project_as_a_non_root_user():
    """Given compose/Dockerfile, then it is python:3.11-slim, pip-installs the repository,
    and runs as a non-root user."""
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"pip install\b.*\s\"?(\.|/src)(\[[a-z,]+\])?\"?\s*(\\|$)", text, re.M)
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users


def test_env_example_documents_every_variable():
    """Given every ${VAR} the Compose files use, then .env.example sets it (or shows it
    commented out) under a comment that explains it."""
    used = set()
    for file in COMPOSE_FILES:
        text = file.read_text()
        used |= set(re.findall(r"(?<!\$)\$\{([A-Za-z_]\w*)", text))
        used |= set(re.findall(r"^\s+(FLEET_\w+):\s*$", text, re.M))  # pass-through knobs
    lines = ENV_EXAMPLE.read_text().splitlines()
    for name in sorted(used):
        index = next((i for i, line in enumerate(lines)
                      if re.match(rf"#?\s*{name}=", line)), None)
        assert index is not None, f"{name} is not in .env.example"
        above = lines[:index]
        assert any(line.startswith("#") for line in above[-8:]), f"{name} has no comment"
    for name in ("MODEL_PATH", "TP_SIZE", "SGLANG_EXTRA_ARGS", "HF_TOKEN", "REDIS_PASSWORD",
                 "REDIS_URL", "SGLANG_URLS", "SGLANG_API_KEY", "FLOWER_BASIC_AUTH", "SHARDS_DIR"):
        assert name in EXAMPLE, name


# --------------------------------------------------------------------------- redis


@files
@env_cases
def test_redis_persists_with_aof_and_never_evicts(file, env_case):
    """Given the redis service, then it is redis:7 with append-only persistence fsynced
    every second, noeviction, a memory ceiling, /data on a volume, and a ping healthcheck;
    its password is REDIS_PASSWORD."""
    redis_ = render(file, "gpu", env_case).service("redis")
    argv = argv_of(redis_.get("entrypoint")) + argv_of(redis_.get("command"))
    assert redis_["image"].split(":")[0] in ("redis", "docker.io/library/redis")
    assert redis_["image"].split(":")[1].startswith("7")
    assert option(argv, "--appendonly") == "yes"
    assert option(argv, "--appendfsync") == "everysec"
    assert option(argv, "--maxmemory-policy") == "noeviction"
    assert option(argv, "--maxmemory")
    assert option(argv, "--requirepass") == ENV_CASES[env_case].get("REDIS_PASSWORD", "")
    assert "/data" in volume_targets(redis_)
    assert "redis-cli" in " ".join(healthcheck_argv(redis_)) and "ping" in " ".join(healthcheck_argv(redis_))


def _spawn_rendered_redis(tmp_path: Path, env_case: str):
    from producer.local import free_port, redis_server_binary, spawn, wait_for
    import redis as redis_py

    redis_ = render(COMPOSE_FILES[0], "gpu", env_case).service("redis")
    argv = argv_of(redis_.get("command"))
    assert argv[0] == "redis-server", argv
    port = free_port()
    process = spawn(f"compose-redis-{port}", [redis_server_binary(), *argv[1:], "--port", str(port),
                                              "--bind", "127.0.0.1", "--dir", str(tmp_path)], tmp_path)
    password = ENV_CASES[env_case].get("REDIS_PASSWORD") or None
    client = redis_py.Redis(port=port, password=password)
    wait_for(client.ping, 20, "redis from the compose command line", process)
    return process, port, client


@pytest.mark.parametrize("env_case", ["example", "empty"])
def test_redis_command_line_runs_on_a_real_server(tmp_path, env_case):
    """Given the rendered redis command line (with a password, and with none),
    when a real redis-server runs it,
    then AOF and noeviction are on, and a client without the password is refused
    exactly when REDIS_PASSWORD is set (an empty --requirepass means no password)."""
    import redis as redis_py

    process, port, client = _spawn_rendered_redis(tmp_path, env_case)
    try:
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert int(client.config_get("maxmemory")["maxmemory"]) > 0
        anonymous = redis_py.Redis(port=port)
        if ENV_CASES[env_case].get("REDIS_PASSWORD"):
            with pytest.raises(redis_py.AuthenticationError):
                anonymous.ping()
        else:
            assert anonymous.ping()
    finally:
        process.stop()


@pytest.mark.parametrize("env_case", ["example", "empty"])
def test_redis_healthcheck_passes_only_with_a_pong(tmp_path, env_case):
    """Given a real Redis started from the rendered command line,
    when the healthcheck runs with the service's REDIS_PASSWORD, then it passes;
    when it runs without the password against a password-protected Redis (redis-cli
    exits 0 on NOAUTH), then it fails."""
    if not shutil.which("redis-cli"):
        pytest.skip("redis-cli is not installed (apt-get install -y redis-tools)")
    process, port, _ = _spawn_rendered_redis(tmp_path, env_case)
    try:
        redis_ = render(COMPOSE_FILES[0], "gpu", env_case).service("redis")
        argv = [a.replace("redis-cli", f"redis-cli -p {port}") for a in healthcheck_argv(redis_)]
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        service_env = {k: v or "" for k, v in env_of(redis_).items()}
        assert subprocess.run(argv, env={**base, **service_env}, timeout=30).returncode == 0
        if service_env.get("REDIS_PASSWORD"):
            assert subprocess.run(argv, env={**base, "REDIS_PASSWORD": ""}, timeout=30).returncode != 0
    finally:
        process.stop()


# --------------------------------------------------------------------------- sglang


@files
@env_cases
def test_sglang_reserves_gpus_and_never_parses_reasoning_or_truncates(file, env_case):
    """Given the sglang service (profile gpu), then it launches SGLang's server on
    0.0.0.0:30000 with MODEL_PATH and TP_SIZE, with neither --reasoning-parser nor
    --allow-auto-truncate, reserves NVIDIA GPUs, shares host IPC, lifts memlock,
    caches the model on a volume and passes HF_TOKEN."""
    rendered = render(file, "gpu", env_case)
    sglang = rendered.service("sglang")
    env = ENV_CASES[env_case]
    assert sglang.get("profiles") == ["gpu"]
    assert sglang["image"].startswith(("lmsysorg/sglang", "docker.io/lmsysorg/sglang"))
    argv = argv_of(sglang.get("entrypoint")) + argv_of(sglang.get("command"))
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"], argv
    assert option(argv, "--host") == "0.0.0.0" and option(argv, "--port") == "30000"
    assert option(argv, "--tp") == env.get("TP_SIZE", "1")
    if "MODEL_PATH" in env:
        assert option(argv, "--model-path") == env["MODEL_PATH"]
    for word in argv:
        assert not word.startswith("--reasoning-parser"), argv
        assert not word.startswith("--allow-auto-truncate"), argv

    devices = sglang["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
               and (d.get("count") in ("all", -1) or (isinstance(d.get("count"), int) and d["count"] > 0)
                    or d.get("device_ids"))
               for d in devices), devices
    assert sglang.get("ipc") == "host"
    memlock = sglang["ulimits"]["memlock"]
    assert memlock == -1 or (isinstance(memlock, dict) and memlock.get("soft") == memlock.get("hard") == -1)
    stack = sglang["ulimits"]["stack"]
    assert stack == 67108864 or (isinstance(stack, dict) and stack.get("soft") == 67108864)
    assert "/root/.cache/huggingface" in volume_targets(sglang)
    assert "HF_TOKEN" in env_of(sglang)


@files
@pytest.mark.parametrize("server,profile", [("sglang", "gpu"), ("standin", "standin")])
def test_server_healthchecks_read_the_status_code_and_wait_for_loading(file, server, profile):
    """Given a server's healthcheck, then it requests /health and judges the status code
    (never the body, which is empty), times out no sooner than a few seconds (health
    takes about one), and the real server gets at least ten minutes to load."""
    service = render(file, profile, "example").service(server)
    argv = healthcheck_argv(service)
    text = " ".join(argv)
    assert "/health" in text and "/health_generate" not in text
    for body_reader in ("grep", "awk", "jq", "sed", "read()", "'ok'", '"ok"', "OK"):
        assert body_reader not in text, f"{server}'s healthcheck reads the body: {text}"
    if argv[0] == "curl":
        assert any(re.fullmatch(r"-[a-zA-Z]*f[a-zA-Z]*|--fail", a) for a in argv), "curl without -f"
    check = service["healthcheck"]
    assert seconds(check["timeout"]) >= 3
    assert int(check["retries"]) >= 2
    if server == "sglang":
        assert seconds(check["interval"]) == 10 and seconds(check["timeout"]) == 5
        assert int(check["retries"]) == 3
        assert seconds(check["start_period"]) >= 600


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """A real SGLang stand-in warming up (503, empty body) and one that is ready (200, empty body)."""
    from producer.local import start_standin, wait_for
    import httpx

    logs = tmp_path_factory.mktemp("compose-standins")
    warming, warming_url = start_standin(logs, None, "--warmup-seconds", "600", wait_healthy=False)
    ready, ready_url = start_standin(logs, None)
    try:
        wait_for(lambda: httpx.get(f"{warming_url}/health", timeout=5).status_code == 503, 60,
                 "warming stand-in", warming)
        yield {"warming": warming_url, "ready": ready_url}
    finally:
        warming.stop()
        ready.stop()


@pytest.mark.parametrize("server,profile", [("sglang", "gpu"), ("standin", "standin")])
def test_server_healthchecks_follow_a_real_servers_status(standins, server, profile):
    """Given a real SGLang stand-in,
    when the server's healthcheck runs against it while it warms up (503), then it fails;
    when it runs against one that is ready (200 with an empty body), then it passes."""
    argv = healthcheck_argv(render(COMPOSE_FILES[0], profile, "example").service(server))
    if argv[0] == "curl" and not shutil.which("curl"):
        pytest.skip("curl is not installed here (it is in the SGLang image)")
    if argv[0] == "python":
        argv = [sys.executable, *argv[1:]]

    def run_against(url: str) -> int:
        pointed = [a.replace("http://localhost:30000", url) for a in argv]
        assert pointed != argv, "the healthcheck does not target http://localhost:30000"
        return subprocess.run(pointed, capture_output=True, timeout=30).returncode

    assert run_against(standins["warming"]) != 0
    assert run_against(standins["ready"]) == 0


@files
def test_standin_runs_the_projects_stand_in(file):
    """Given the standin service (profile standin), then it is built from the repository
    and runs `python -m sglang_standin` on 0.0.0.0:30000."""
    standin = render(file, "standin", "example").service("standin")
    assert standin.get("profiles") == ["standin"] and standin.get("build")
    argv = argv_of(standin.get("entrypoint")) + argv_of(standin.get("command"))
    assert argv[:3] == ["python", "-m", "sglang_standin"], argv
    assert option(argv, "--host") == "0.0.0.0" and option(argv, "--port") == "30000"


# --------------------------------------------------------------------------- worker


@files
@profiles
@env_cases
def test_worker_runs_celery_bound_to_its_servers(file, profile, env_case):
    """Given the worker service, then it runs `celery -A workers worker`, is bound to
    SGLANG_URLS (the GPU server by default), writes shards to a volume at OUTPUT_DIR,
    passes SGLANG_API_KEY, and gets more time to stop than it drains for on SIGTERM."""
    worker = render(file, profile, env_case).service("worker")
    argv = argv_of(worker.get("entrypoint")) + argv_of(worker.get("command"))
    assert argv[:4] == ["celery", "-A", "workers", "worker"], argv
    env = env_of(worker)
    expected_urls = ENV_CASES[env_case].get("SGLANG_URLS", "http://sglang:30000")
    assert env["SGLANG_URLS"] == expected_urls
    assert env["OUTPUT_DIR"] in volume_targets(worker)
    assert "SGLANG_API_KEY" in env and env.get("REDIS_URL")
    assert seconds(worker.get("stop_grace_period", "10s")) >= shutdown_grace(env) + 30
    assert worker.get("build") or worker.get("image")


@files
@profiles
def test_worker_starts_under_either_profile(file, profile):
    """Given either profile, then the worker depends on a healthy Redis and on no
    service that profile leaves out (unless that dependency is `required: false`)."""
    rendered = render(file, profile, "example")
    depends = rendered.service("worker").get("depends_on") or {}
    if isinstance(depends, list):
        depends = {name: {} for name in depends}
    assert depends.get("redis", {}).get("condition") == "service_healthy"
    for name, spec in depends.items():
        assert name in rendered.services or (spec or {}).get("required") is False, name


@files
@profiles
@pytest.mark.parametrize("service", ["worker", "flower"])
def test_worker_and_flower_reach_redis_with_its_password(file, profile, service):
    """Given the example settings, then the worker's and Flower's REDIS_URL carry
    the REDIS_PASSWORD that Redis requires."""
    env = env_of(render(file, profile, "example").service(service))
    assert env["REDIS_URL"].startswith(("redis://", "rediss://"))
    assert redis_password(env["REDIS_URL"]) == EXAMPLE["REDIS_PASSWORD"]


# --------------------------------------------------------------------------- flower


@files
@env_cases
def test_flower_has_basic_auth_and_listens_on_loopback_by_default(file, env_case):
    """Given the flower service, then it runs `celery -A workers flower` on 5555 with
    FLOWER_BASIC_AUTH from the settings, and is published on 127.0.0.1 unless told
    otherwise."""
    flower = render(file, "gpu", env_case).service("flower")
    command = argv_of(flower.get("command"))
    assert command[:4] == ["celery", "-A", "workers", "flower"], command
    assert option(command, "--port") == "5555"
    env = env_of(flower)
    assert "FLOWER_BASIC_AUTH" in env
    assert (env["FLOWER_BASIC_AUTH"] or "") == ENV_CASES[env_case].get("FLOWER_BASIC_AUTH", "")
    published = ports_of(flower)
    assert [target for _, _, target in published] == ["5555"]
    if "FLOWER_HOST_IP" not in ENV_CASES[env_case]:
        assert all(ip in LOOPBACK for ip, _, _ in published), published


@files
@env_cases
def test_nothing_is_published_beyond_loopback_without_a_password(file, env_case):
    """Given any settings, when a service is published beyond loopback, then it
    requires credentials: Flower its basic auth, Redis its password."""
    rendered = render(file, "gpu", env_case)
    for name, service in rendered.services.items():
        exposed = [p for p in ports_of(service) if p[0] not in LOOPBACK]
        if not exposed:
            continue
        if name == "flower":
            assert re.fullmatch(r"[^:,]+:[^,]+(,[^:,]+:[^,]+)*", env_of(service).get("FLOWER_BASIC_AUTH") or "")
        elif name == "redis":
            assert option(argv_of(service.get("command")), "--requirepass")
        else:
            raise AssertionError(f"{name} is published on {exposed}")
    if env_case == "empty":
        for service in rendered.services.values():
            assert all(ip in LOOPBACK for ip, _, _ in ports_of(service)), service.get("ports")


@pytest.mark.parametrize("auth,starts", [("", False), ("admin:secret", True)])
def test_flower_refuses_to_start_without_basic_auth(auth, starts):
    """Given Flower's entrypoint and command,
    when FLOWER_BASIC_AUTH is empty, then it exits with a message before Flower starts;
    when it is set, then it execs the command."""
    flower = render(COMPOSE_FILES[0], "gpu", "example").service("flower")
    entrypoint = [a.replace("$$", "$") for a in argv_of(flower.get("entrypoint"))]
    assert entrypoint, "flower has no entrypoint guarding its auth"
    done = subprocess.run([*entrypoint, sys.executable, "-c", "print('flower-started')"], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                           "FLOWER_BASIC_AUTH": auth})
    assert ("flower-started" in done.stdout) == starts
    assert (done.returncode == 0) == starts
    if not starts:
        assert "FLOWER_BASIC_AUTH" in done.stderr


# --------------------------------------------------------------------------- SGLang's gateway


@files
def test_the_gateway_runs_the_pinned_sglang_router_with_a_short_health_check_interval(file):
    """Given the gateway service (profile gateway), then it is built from compose/Dockerfile.gateway,
    which installs the sglang-router version scripts/setup.sh tests against, listens on 0.0.0.0:30000,
    checks its servers every 5 s (its default is a minute) and is healthy by its /readiness."""
    gateway = render(file, "gateway", "example").service("gateway")
    assert gateway.get("profiles") == ["gateway"]
    dockerfile = (ROOT / "compose" / "Dockerfile.gateway").read_text()
    [pinned] = re.findall(r"sglang-router==([\d.]+)", dockerfile)
    assert f"sglang-router=={pinned}" in (ROOT / "scripts" / "setup.sh").read_text()
    argv = argv_of(gateway.get("command"))
    assert option(argv, "--host") == "0.0.0.0" and option(argv, "--port") == "30000"
    assert option(argv, "--health-check-interval-secs") == "5"
    assert option(argv, "--worker-urls") == EXAMPLE["GATEWAY_WORKER_URLS"].split()[0]
    assert "/readiness" in " ".join(healthcheck_argv(gateway))


@files
def test_a_worker_bound_to_the_gateway_renders_with_it(file, monkeypatch):
    """Given SGLANG_URLS naming the gateway, then the gateway profile starts it beside the core services
    and no SGLang server, and the worker is bound to it."""
    monkeypatch.setitem(ENV_CASES, "gateway", {**EXAMPLE, "SGLANG_URLS": "http://gateway:30000"})
    rendered = render(file, "gateway", "gateway")
    assert {"redis", "worker", "flower", "gateway"} <= set(rendered.services)
    assert not {"sglang", "standin"} & set(rendered.services)
    assert env_of(rendered.service("worker"))["SGLANG_URLS"] == "http://gateway:30000"
