"""deploy/ checked offline with each ecosystem's own tools.

- Kubernetes: every overlay renders with `kubectl kustomize`, and every object it renders
  validates against the Kubernetes schemas (`kubernetes-validate`, strict: an unknown
  field fails) or, for KEDA's and the Prometheus Operator's kinds, against their CRDs as
  published (deploy/crds/, copied unchanged). The rendered worker agrees with the fleet's
  own settings (workers/settings.py, workers/intake/shutdown.py, contract/keys.py).
- Slurm: the sbatch template and the per-node script pass `bash -n`, and their worker
  command line is the documented one (docs/deploy/one-node.md).
- Grafana and alerts: every query parses, and (tests/test_deploy.py) every `fleet_*` metric
  and label they use is on a real worker's /metrics.

These are the fast checks (`kubectl` renders, nothing runs; skipped, saying so, where
kubectl is absent); tests/test_deploy.py starts Redis, a stand-in and a worker for the rest.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from contract.keys import DEFAULT_QUEUE, queue_for
from tests.specs.image_pins import images_in, project_version, sglang_version, why_unpinned
from workers.settings import Settings
from workers.intake.shutdown import HAND_BACK_SECONDS, SETTLE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# The oldest Kubernetes the manifests support (native sidecars: restartPolicy on an init
# container, on by default since 1.29) and the newest kubernetes-validate ships.
K8S_VERSIONS = ("1.29", "latest")
SECRET_NAMES = {"REDIS_URL", "REDIS_PASSWORD", "SGLANG_API_KEY", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "FLOWER_BASIC_AUTH", "HF_TOKEN"}
# Settings the contract names that a sibling branch adds to the settings (Sentinel support).
CONTRACT_ONLY = {"FLEET_SENTINEL_MASTER"}
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: nothing renders the overlays")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


promql = _load("fleet_promql", DEPLOY / "grafana" / "promql.py")


@lru_cache(maxsize=None)
def rendered(overlay: Path) -> tuple:
    out = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {overlay.name} failed:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def objects(overlay: Path, kind: str, name: str | None = None) -> list[dict]:
    return [copy.deepcopy(o) for o in rendered(overlay)
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def generation_pod(overlay: Path) -> dict:
    [deployment] = objects(overlay, "Deployment", "fleet-generation")
    return deployment["spec"]["template"]


def container(pod: dict, name: str) -> dict:
    spec = pod["spec"]
    [found] = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name]
    return found


def documented_worker_command() -> list[str]:
    """The worker command line of the documentation's walk-through (docs/deploy/one-node.md)."""
    text = (ROOT / "docs" / "deploy" / "one-node.md").read_text()
    [line] = [l.strip() for l in text.splitlines() if l.strip().startswith("celery -A workers worker")]
    return shlex.split(line)


# --- CRDs: the published schemas ----------------------------------------------------------

def _strict(schema: dict) -> dict:
    """An object schema with `properties` and no say on other fields refuses them, as
    kubernetes-validate's strict mode does for built-in kinds (the API server would prune
    them silently: a typo would vanish)."""
    if isinstance(schema, dict):
        for value in schema.values():
            if isinstance(value, dict):
                _strict(value)
            elif isinstance(value, list):
                for item in value:
                    _strict(item)
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    return schema


@lru_cache(maxsize=None)
def crd_schemas() -> dict:
    """(apiVersion, kind) -> the CRD's openAPIV3Schema, from deploy/crds/."""
    schemas = {}
    for path in (DEPLOY / "crds").glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                schema["properties"]["metadata"] = {"type": "object"}
                schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def validate(obj: dict) -> None:
    import kubernetes_validate

    schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        jsonschema.Draft7Validator(schema).validate(obj)
        return
    for version in K8S_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        kubernetes_validate.validate(obj, wanted, strict=True)


# --- Kubernetes ---------------------------------------------------------------------------

def test_every_overlay_is_listed():
    # Given deploy/k8s, then it has the overlays the documentation walks through
    assert {p.name for p in OVERLAYS} == {"gpu", "sentinel", "prometheus-operator", "standin", "gateway"}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_rendered_object_validates_against_its_schema(overlay):
    # Given an overlay rendered by kubectl kustomize
    docs = rendered(overlay)
    assert docs
    # Then every object validates against Kubernetes' own schema or its CRD's, strictly
    for obj in docs:
        try:
            validate(obj)
        except Exception as exc:
            raise AssertionError(f"{overlay.name}: {obj['kind']}/{obj['metadata']['name']}: {exc}") from None


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_image_is_pinned_to_a_tested_version(overlay):
    # Given an overlay rendered by kubectl kustomize
    images = sorted({image for obj in rendered(overlay) for image in images_in(obj)})

    # Then it names images, none :latest or untagged, SGLang's and the fleet's at their tested versions
    assert any("reasoning-fleet" in image for image in images), images
    assert [why for why in map(why_unpinned, images) if why] == []


def test_an_unpinned_image_is_told_apart():
    assert why_unpinned("lmsysorg/sglang:latest") and why_unpinned("reasoning-fleet") \
        and why_unpinned("registry:5000/reasoning-fleet") and why_unpinned("lmsysorg/sglang:v0.5.2-cu126") \
        and why_unpinned("reasoning-fleet:0.0.9")
    assert not why_unpinned(f"lmsysorg/sglang:v{sglang_version()}-cu126") and not why_unpinned("redis:7") \
        and not why_unpinned(f"registry:5000/team/reasoning-fleet:{project_version()}") \
        and not why_unpinned("redis@sha256:" + "0" * 64)


def test_a_typo_fails_validation():
    # Given objects with a misspelt field, then validation refuses them (the check can fail)
    bad_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
                      "spec": {"selector": {}, "template": {"spec": {"containers": [
                          {"name": "w", "image": "i", "terminationGracePeriod": 5}]}}}}
    bad_scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
                  "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "redis", "metadata": {}}],
                           "minReplicas": 1}}
    for obj in (bad_deployment, bad_scaled):
        with pytest.raises(Exception):
            validate(obj)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_secrets_come_from_secrets_never_from_configmaps(overlay):
    # Given every container of the overlay
    for cm in objects(overlay, "ConfigMap"):
        leaked = {k for k in cm.get("data", {}) if k in SECRET_NAMES or "password" in k.lower()}
        assert not leaked, f"ConfigMap {cm['metadata']['name']} holds {leaked}"
    pods = [o["spec"]["template"] for o in rendered(overlay) if o["kind"] in ("Deployment", "StatefulSet")]
    for pod in pods:
        for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
            for env in c.get("env", []):
                # Then each secret value is a secretKeyRef, never a literal or a ConfigMap key
                if env["name"] in SECRET_NAMES:
                    assert "secretKeyRef" in env.get("valueFrom", {}), f"{c['name']}: {env['name']} is not from a Secret"
            # and a ConfigMap a container takes all of is one of those checked above
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    assert objects(overlay, "ConfigMap", source["configMapRef"]["name"])


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_worker_agrees_with_the_fleets_settings(overlay, monkeypatch):
    # Given the rendered generation pod, its worker's environment read by the fleet's own Settings
    pod = generation_pod(overlay)
    worker, server = container(pod, "worker"), container(pod, "sglang")
    names = {env["name"] for env in worker["env"]}
    known = {f"FLEET_{f.upper()}" for f in Settings.model_fields} | {
        "REDIS_URL", "SGLANG_URLS", "OUTPUT_DIR", "SGLANG_API_KEY"} | CONTRACT_ONLY
    assert names <= known, f"the worker is given settings the fleet does not read: {names - known}"
    for key in list(os.environ):
        if key.startswith("FLEET_") or key in known:
            monkeypatch.delenv(key)
    for env in worker["env"]:
        if env["name"] not in CONTRACT_ONLY:
            monkeypatch.setenv(env["name"], env.get("value", "from-a-secret"))
    settings = Settings()

    # Then the pod's grace period covers the drain: the grace, the settle and the hand-back
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= settings.shutdown_grace + SETTLE_SECONDS + HAND_BACK_SECONDS
    # and the worker is bound to its own pod's server, on the port the server listens on (or, in the
    # gateway's overlay, to the gateway's Service)
    [port] = [p["containerPort"] for p in server["ports"] if p["name"] == "sglang"]
    gateways = objects(overlay, "Service", "fleet-gateway")
    assert settings.server_urls == ([f"http://fleet-gateway:{gateways[0]['spec']['ports'][0]['port']}"]
                                    if gateways else [f"http://localhost:{port}"])
    # and the server's probes read /health's status code there, never faster than the
    # fleet's own health timeout, with a start-up allowance for loading weights
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = server[probe]
        assert check["httpGet"]["path"] == "/health" and check["httpGet"]["port"] in (port, "sglang")
        assert check["timeoutSeconds"] >= settings.health_timeout
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    # and SGLang outlives the worker's drain: a native sidecar, stopped after the worker
    assert server["restartPolicy"] == "Always" and server in pod["spec"]["initContainers"]
    # and /metrics is where the pod says Prometheus finds it, reachable from outside the pod
    [metrics] = [p["containerPort"] for p in worker["ports"] if p["name"] == "metrics"]
    assert metrics == settings.metrics_port and settings.metrics_host == "0.0.0.0"
    annotations = pod["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert annotations["prometheus.io/port"] == str(settings.metrics_port)
    # and the worker runs the documented command (tests/specs/test_fleet_deploy.py: and its flags)
    assert worker["command"][:len(documented_worker_command())] == documented_worker_command()


@needs_kubectl
def test_the_gateway_finds_the_generation_servers_checks_them_often_and_is_ready_by_its_readiness():
    # Given the gateway overlay's gateway
    overlay = K8S / "overlays" / "gateway"
    [deployment] = objects(overlay, "Deployment", "fleet-gateway")
    pod = deployment["spec"]["template"]
    gateway = container(pod, "gateway")
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in gateway["args"] if a.startswith("--"))
    # Then it discovers the generation pods by their label, on their server's port, in its namespace
    [generation] = objects(overlay, "Deployment", "fleet-generation")
    labels = generation["spec"]["template"]["metadata"]["labels"]
    selector = gateway["args"][gateway["args"].index("--selector") + 1]
    key, value = selector.split("=")
    assert labels[key] == value and "--service-discovery" in args
    server_port = [p["containerPort"] for p in container(generation_pod(overlay), "sglang")["ports"]
                   if p["name"] == "sglang"]
    assert [int(args["--service-discovery-port"])] == server_port
    # which its service account may list, and it checks them every 5 s (its default is a minute)
    [role] = objects(overlay, "Role", "fleet-gateway")
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["pods"]
    assert pod["spec"]["serviceAccountName"] == "fleet-gateway" and args["--health-check-interval-secs"] == "5"
    # and it is ready by /readiness (its /health answers 200 with no server), takes the servers' key
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert args["--api-key"] == "$(SGLANG_API_KEY)"
    # and its image is the pinned sglang-router the tests run
    assert gateway["image"].endswith(":0.3.2") and "sglang-router==0.3.2" in (ROOT / "scripts" / "setup.sh").read_text()


@needs_kubectl
def test_keda_scales_on_the_runs_real_queue_names():
    # Given the GPU overlay's ScaledObject and the model its servers load
    overlay = K8S / "overlays" / "gpu"
    [scaled] = objects(overlay, "ScaledObject")
    [model] = objects(overlay, "ConfigMap", "fleet-model")
    # Then it watches the queue of runs enqueued with --served-model and the default queue
    lists = {t["metadata"]["listName"] for t in scaled["spec"]["triggers"]}
    assert lists == {queue_for(DEFAULT_QUEUE, model["data"]["SERVED_MODEL"]), DEFAULT_QUEUE}
    # and scales the generation pods, never to zero (the list does not count prompts in flight)
    assert scaled["spec"]["scaleTargetRef"]["name"] == "fleet-generation"
    assert scaled["spec"]["minReplicaCount"] >= 1
    # and reads Redis's password from the Secret through a TriggerAuthentication
    [auth] = objects(overlay, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"][0]["name"] == "fleet-redis"
    # and the Sentinel overlay asks the Sentinels for the same lists
    sentinel = objects(K8S / "overlays" / "sentinel", "ScaledObject")[0]["spec"]["triggers"]
    assert {t["metadata"]["listName"] for t in sentinel} == lists
    assert {t["type"] for t in sentinel} == {"redis-sentinel"} and all(t["metadata"]["sentinelMaster"] for t in sentinel)


@needs_kubectl
def test_redis_keeps_its_data_and_never_evicts():
    # Given the in-cluster Redis
    [redis_set] = objects(K8S / "overlays" / "gpu", "StatefulSet", "fleet-redis")
    args = container(redis_set["spec"]["template"], "redis")["args"]
    options = dict(zip(args[::2], args[1::2]))
    # Then it appends every write to its AOF on a persistent volume and refuses writes when full
    assert options["--appendonly"] == "yes" and options["--maxmemory-policy"] == "noeviction"
    assert redis_set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    # and the Sentinel overlay has no Redis of its own, but the Sentinel master's name
    sentinel = K8S / "overlays" / "sentinel"
    assert not objects(sentinel, "StatefulSet")
    env = {e["name"] for e in container(generation_pod(sentinel), "worker")["env"]}
    assert {"REDIS_URL", "FLEET_SENTINEL_MASTER"} <= env


@needs_kubectl
def test_flower_requires_basic_auth_and_the_pdb_covers_the_generation_pods():
    overlay = K8S / "overlays" / "gpu"
    [flower] = objects(overlay, "Deployment", "fleet-flower")
    env = {e["name"]: e for e in container(flower["spec"]["template"], "flower")["env"]}
    assert env["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]["name"] == "fleet-flower"
    [pdb] = objects(overlay, "PodDisruptionBudget")
    labels = generation_pod(overlay)["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


@needs_kubectl
def test_the_servicemonitor_scrapes_ports_the_service_has_and_the_rules_are_the_alerts_file():
    overlay = K8S / "overlays" / "prometheus-operator"
    [monitor] = objects(overlay, "ServiceMonitor")
    [service] = objects(overlay, "Service", "fleet-generation")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    [rule] = objects(overlay, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())


# --- Slurm ------------------------------------------------------------------------------

SLURM = DEPLOY / "slurm"


@pytest.mark.parametrize("script", ["fleet.sbatch", "fleet-node.sh"])
def test_the_slurm_scripts_parse(script):
    out = subprocess.run(["bash", "-n", str(SLURM / script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_slurm_drain_fits_before_the_time_limit_and_runs_the_documented_worker():
    sbatch = (SLURM / "fleet.sbatch").read_text()
    node = (SLURM / "fleet-node.sh").read_text()
    # Given the grace the template exports, then the signal comes early enough for the drain
    grace = int(re.search(r"FLEET_SHUTDOWN_GRACE:-(\d+)", sbatch).group(1))
    [signal_at] = re.findall(r"^#SBATCH --signal=TERM@(\d+)$", sbatch, re.M)
    assert int(signal_at) >= grace + SETTLE_SECONDS + HAND_BACK_SECONDS + 60  # Slurm's jitter: up to 60 s
    # and each node's worker is bound to that node's server and runs the documented command
    assert 'SGLANG_URLS="http://localhost:$SGLANG_PORT"' in node
    [line] = [l.strip() for l in node.splitlines() if l.strip().startswith("celery ")]
    assert shlex.split(line)[:len(documented_worker_command())] == documented_worker_command()
    # and the documentation's Slurm walk-through starts this template
    assert "deploy/slurm/fleet.sbatch" in (ROOT / "docs" / "deploy" / "slurm.md").read_text()


# --- Grafana and alerts ------------------------------------------------------------------

def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "fleet.json").read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def alert_queries() -> list[tuple[str, str]]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    return [(r["alert"], r["expr"]) for g in groups for r in g["rules"]]


def test_the_dashboard_is_importable_with_a_prometheus_datasource_variable():
    board = dashboard()
    [source] = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${%s}" % source["name"] and panel["targets"]
    # and it has the panels the issue asks for, every query parsing as PromQL
    for title, query in dashboard_queries() + alert_queries():
        promql.parse(query)
    names = {name for _, q in dashboard_queries() for name, _ in promql.selectors(q)}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cached_tokens_total",
            "sglang:prompt_tokens_total", "fleet_queue_depth", "fleet_shard_commit_seconds_bucket",
            "fleet_cached_tokens_total", "fleet_prompt_tokens_total"} <= names


def test_the_alerts_cover_a_stall_a_server_down_storage_and_dead_letters():
    assert {a for a, _ in alert_queries()} == {"FleetRunStalled", "FleetServerDown", "FleetStorageFailing",
                                               "FleetDeadLetterRateHigh"}


def test_the_query_reader_finds_metrics_and_the_labels_a_query_uses():
    # A worked example of the parser the slow test relies on
    found = promql.selectors('sum by (reason) (rate(fleet_dead_letters_total{job=~"$job"}[$__rate_interval]))'
                             ' / on (reason) fleet_x')
    assert found == [("fleet_dead_letters_total", frozenset({"reason", "job"})), ("fleet_x", frozenset({"reason"}))]


def test_the_evaluator_computes_rates_sums_and_quantiles():
    before = promql.Scrape.of('a_total{k="x"} 10\na_total{k="y"} 0\n', at=0)
    after = promql.Scrape.of('a_total{k="x"} 40\na_total{k="y"} 30\nh_bucket{le="1"} 5\nh_bucket{le="2"} 10\n'
                             'h_bucket{le="+Inf"} 10\n', at=10)
    assert promql.evaluate("sum(rate(a_total[5m]))", before, after) == [({}, 6.0)]
    assert promql.evaluate('sum by (k) (rate(a_total{k="x"}[5m])) > 1', before, after) == [({"k": "x"}, 3.0)]
    assert promql.evaluate("histogram_quantile(0.75, h_bucket)", before, after) == [({}, 1.5)]
    assert promql.evaluate("(sum(nothing) or on() vector(0)) == 0", before, after) == [({}, 0.0)]
