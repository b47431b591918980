#!/usr/bin/env bash
# The test suite, against real processes (Redis, Celery workers, SGLang stand-ins, Flower, Chromium).
# Tests run side by side in pytest-xdist workers (each test starts its own processes on free ports,
# and the real-process tests mostly wait on them); tests marked with one xdist_group run one after
# another in one worker. Arguments go to pytest: `-m "not slow"` for the fast layer, `-n 0` to run
# serially; FLEET_TEST_WORKERS sets how many tests run at once.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The browser tests need Debian's chromium and chromedriver (root or sudo): without them, no run.
if ! browser=$(scripts/install-browser.sh .venv/bin/python 2>&1); then
  echo "$browser" >&2
  echo "error: scripts/install-browser.sh could not install the browser the browser tests need" \
       "(tests/test_flower.py); install chromium and chromium-driver, then run again" >&2
  exit 1
fi
exec .venv/bin/python -m pytest -n "${FLEET_TEST_WORKERS:-6}" --dist loadgroup "$@"
