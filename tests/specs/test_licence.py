"""The licence a newcomer looks for: a LICENSE file, the package's metadata, the README."""
from __future__ import annotations

import tomllib
from importlib.metadata import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_is_apache_2_in_its_licence_file_its_metadata_and_its_readme():
    # Given the checkout and its installed package
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    licence = (ROOT / "LICENSE").read_text()

    # Then LICENSE is the standard Apache-2.0 text, and pyproject, the installed metadata and the README say it
    assert licence.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in licence and len(licence.splitlines()) > 150
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert metadata("reasoning-fleet")["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (ROOT / "README.md").read_text().split("## Licence", 1)[1]
