#!/usr/bin/env bash
# Create .venv and install the project with its test and docs extras (once; again when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  [ -d .venv ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,docs]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
