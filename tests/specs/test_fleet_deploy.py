"""Every deploy path starts workers without Celery's gossip and mingle.

Gossip has every worker receive every other worker's heartbeat event, so
Redis's output grows with the square of the fleet (about 360·N² bytes a
second: one Redis core at about 400 nodes); mingle asks every worker at each
start. The worker turns both off itself (`workers/intake/consumer.py`), and each deploy
path says so on its command line too, so that an image or a script run with
another app still starts without them. Given each path as its own tool renders
it (`kubectl kustomize` for every overlay, Compose for every profile, the
Dockerfile's CMD, the Slurm node script's command), then the worker's command
is `celery -A workers worker ... --without-gossip --without-mingle`.
"""
from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.specs.test_deploy import OVERLAYS, SLURM, container, generation_pod, needs_kubectl
from tests.test_compose import COMPOSE_DIR, COMPOSE_FILES, PROFILES, argv_of, render

FLAGS = ("--without-gossip", "--without-mingle")
WORKER = ["celery", "-A", "workers", "worker"]


def starts_without_gossip_and_mingle(argv: list[str]) -> bool:
    return argv[:len(WORKER)] == WORKER and all(flag in argv for flag in FLAGS)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_kubernetes_overlay_starts_its_workers_without_gossip_and_mingle(overlay):
    worker = container(generation_pod(overlay), "worker")
    assert starts_without_gossip_and_mingle(worker["command"] + worker.get("args", [])), worker["command"]


@pytest.mark.parametrize("file", COMPOSE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_compose_profile_starts_its_worker_without_gossip_and_mingle(file, profile):
    worker = render(file, profile, "example").service("worker")
    argv = argv_of(worker.get("entrypoint")) + argv_of(worker.get("command"))
    assert starts_without_gossip_and_mingle(argv), argv


def test_the_images_default_command_starts_a_worker_without_gossip_and_mingle():
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    [cmd] = re.findall(r"^CMD\s+(\[.*\])\s*$", text, re.M)
    assert starts_without_gossip_and_mingle(json.loads(cmd)), cmd


def test_each_slurm_node_starts_its_worker_without_gossip_and_mingle():
    node = (SLURM / "fleet-node.sh").read_text()
    [line] = [l.strip() for l in node.splitlines() if l.strip().startswith("celery ")]
    argv = shlex.split(line.split(">", 1)[0])
    assert starts_without_gossip_and_mingle(argv), line
