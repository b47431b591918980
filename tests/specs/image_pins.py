"""The images a deployment names (Compose, Kubernetes): each pinned, never `:latest` or
untagged, and to the versions the fleet is tested with: SGLang's (scripts/setup.sh's
SGLANG_VERSION, the server the suite runs) and the project's own (pyproject's version).
A deployment that pulls `latest` runs whatever was pushed last, not what was tested."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def sglang_version() -> str:
    [version] = re.findall(r"^SGLANG_VERSION=([\w.]+)$", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    return version


def tag_of(image: str) -> str | None:
    """The tag of `REGISTRY/NAME:TAG` (None: untagged); a digest (`@sha256:...`) pins too."""
    if "@" in image:
        return image.split("@", 1)[1]
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else None


def why_unpinned(image: str) -> str | None:
    """Why `image` is not pinned to a tested version, or None when it is."""
    tag = tag_of(image)
    if tag is None or tag == "latest":
        return f"{image}: untagged or latest"
    repository = image.split("@", 1)[0].rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    if repository.endswith("lmsysorg/sglang") and not re.fullmatch(rf"v{re.escape(sglang_version())}(-\S+)?", tag):
        return f"{image}: not SGLang {sglang_version()}, the version the fleet is tested with (scripts/setup.sh)"
    if repository.endswith("reasoning-fleet") and tag != project_version():
        return f"{image}: not the project's version {project_version()} (pyproject.toml)"
    return None


def images_in(node) -> Iterator[str]:
    """Every `image: <string>` in a rendered document, however deep (containers, init containers)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from images_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from images_in(item)
