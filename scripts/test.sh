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
       "(tests/reporting/test_flower.py); install chromium and chromium-driver, then run again" >&2
  exit 1
fi
# Bytecode is cached (__pycache__, ignored by git) even where the environment says not to write it:
# every worker, stand-in and producer command a test starts would otherwise compile the project's
# modules again, and every pytest worker rewrite the test modules' asserts again (2-3 s each).
unset PYTHONDONTWRITEBYTECODE
# How many tests at once. The whole suite: three a core (six on 2 cores), sixteen at most. It is
# bound by CPU (each test starts Redis, workers, stand-ins and producer commands, a few CPU-seconds
# each), and three a core keep the cores busy while some tests wait on leases, health rounds and
# restarts; each more worker adds ~5 CPU-s (collection, the session tokenizer), and on 2 cores
# eight were about a minute faster but stretched timing-bound tests further. The fast layer alone:
# two, since each worker's start-up costs more than the specs it would run (xdist with six: 79
# CPU-s; with two: 44; serially: 38).
workers="${FLEET_TEST_WORKERS:-}"
if [ -z "$workers" ]; then
  case " $* " in
    *"not slow"*) workers=2 ;;
    *) workers=$(( $(nproc) * 3 )); [ "$workers" -le 16 ] || workers=16 ;;
  esac
fi
# --no-loadscope-reorder: keep tests/conftest.py's order (the slow tests first, the specs after).
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup --no-loadscope-reorder "$@"
