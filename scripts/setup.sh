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
