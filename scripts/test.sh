#!/usr/bin/env bash
# The test suite, against real processes (Redis, Celery workers, SGLang stand-ins, Flower, Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The browser test needs Debian's chromium (root or sudo); without it that one test skips.
scripts/install-browser.sh .venv/bin/python >/dev/null 2>&1 || echo "note: chromium not installed; the browser test will skip" >&2
exec .venv/bin/python -m pytest "$@"
