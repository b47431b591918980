#!/usr/bin/env bash
# Create .venv and install the project with its test extra (once; again when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  [ -d .venv ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# SGLang's real gateway for the tests (tests/real_gateway.py): sglang-router, a Rust binary in a wheel,
# in a virtual environment of its own (its FastAPI would pin the stand-in's Starlette). The version is
# the one the README names as supported; FLEET_SGLANG_ROUTER overrides it to try another.
ROUTER="${FLEET_SGLANG_ROUTER:-sglang-router==0.3.2}"
router_stamp=".venv-router/.installed-$(echo "$ROUTER" | sha256sum | cut -c1-16)"
if [ ! -f "$router_stamp" ]; then
  [ -d .venv-router ] || "$PYTHON" -m venv .venv-router
  .venv-router/bin/python -m pip install --quiet --upgrade pip
  .venv-router/bin/python -m pip install --quiet "$ROUTER"
  rm -f .venv-router/.installed-*
  touch "$router_stamp"
fi
