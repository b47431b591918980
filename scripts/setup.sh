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
# constraints.txt pins the libraries whose internals the worker stands on (contract/broker/versions.py): every
# install goes through it, and a change to it installs again.
hash="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f ".venv/.installed-$hash-test" ] && [ ! -f ".venv/.installed-$hash-$role" ]; then
  [ -d .venv ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[$extras]"
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
# The real SGLang server on its CPU engine (tests/real_sglang.py): the package from the index without its
# CUDA-only dependencies, in an environment of its own, built once into a cache folder outside the clone
# that later runs and fresh clones reuse (~6 GB, under 2 minutes the first time here). FLEET_SGLANG_VENV moves it.
SGLANG_VERSION=0.5.23
SGLANG_VENV="${FLEET_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/reasoning-fleet/sglang-$SGLANG_VERSION}"
sglang_stamp="$SGLANG_VENV/.installed-$(sha256sum scripts/sglang-cpu-requirements.txt | cut -c1-16)"
if [ ! -f "$sglang_stamp" ]; then
  echo "setup: building SGLang $SGLANG_VERSION's CPU environment in $SGLANG_VENV (once, a few minutes)" >&2
  [ -d "$SGLANG_VENV" ] || "$PYTHON" -m venv "$SGLANG_VENV"
  "$SGLANG_VENV/bin/python" -m pip install --quiet --upgrade pip
  "$SGLANG_VENV/bin/python" -m pip install --quiet --no-deps "sglang==$SGLANG_VERSION"
  "$SGLANG_VENV/bin/python" -m pip install --quiet -r scripts/sglang-cpu-requirements.txt
  rm -f "$SGLANG_VENV"/.installed-*
  touch "$sglang_stamp"
fi
