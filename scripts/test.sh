#!/usr/bin/env bash
# The test suite, against real processes (Redis, Celery workers, SGLang stand-ins).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
