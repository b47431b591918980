#!/usr/bin/env bash
# Create .venv and install the project with the extras a use needs, once (again when pyproject.toml
# changes): `scripts/setup.sh` (or `test`) the suite's: every role's and the docs site's ([test,docs]);
# `scripts/setup.sh demo` the demo's ([producer,worker,standin]). An install for the suite serves the demo too.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
role="${1:-test}"
case "$role" in
  test) extras="test,docs" ;;
  demo) extras="producer,worker,standin" ;;
  *) echo "usage: scripts/setup.sh [test|demo]" >&2; exit 2 ;;
esac
hash="$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f ".venv/.installed-$hash-test" ] && [ ! -f ".venv/.installed-$hash-$role" ]; then
  [ -d .venv ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  rm -f .venv/.installed-*
  touch ".venv/.installed-$hash-$role"
fi
# SGLang's real gateway for the tests (tests/real_gateway.py): sglang-router, a Rust binary in a wheel,
# in a virtual environment of its own (its FastAPI would pin the stand-in's Starlette). The version is
# the one the documentation names as supported; FLEET_SGLANG_ROUTER overrides it to try another.
# The demo does not need it.
[ "$role" = test ] || exit 0
ROUTER="${FLEET_SGLANG_ROUTER:-sglang-router==0.3.2}"
router_stamp=".venv-router/.installed-$(echo "$ROUTER" | sha256sum | cut -c1-16)"
if [ ! -f "$router_stamp" ]; then
  [ -d .venv-router ] || "$PYTHON" -m venv .venv-router
  .venv-router/bin/python -m pip install --quiet --upgrade pip
  .venv-router/bin/python -m pip install --quiet "$ROUTER"
  rm -f .venv-router/.installed-*
  touch "$router_stamp"
fi
