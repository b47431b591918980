#!/usr/bin/env bash
# What the browser test (tests/reporting/test_flower.py) needs: Debian's chromium and chromedriver, and
# Selenium in the project's environment. Idempotent. Nothing downloads a browser of its own:
# the test hands Selenium /usr/bin/chromedriver, so Selenium Manager never runs.
# Usage: scripts/install-browser.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-${PYTHON:-}}"
if [ -z "$PYTHON" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
SELENIUM_SPEC="${SELENIUM_SPEC:-selenium>=4.20}"

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
fi

if ! "$PYTHON" -c "import selenium" 2>/dev/null; then
  "$PYTHON" -m pip install --quiet "$SELENIUM_SPEC"
fi

/usr/bin/chromium --version 2>/dev/null | grep -i chromium
/usr/bin/chromedriver --version
"$PYTHON" -c "import selenium; print('selenium', selenium.__version__)"
