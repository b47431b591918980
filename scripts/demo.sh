#!/usr/bin/env bash
# The whole job on this machine: local Redis, two SGLang stand-ins, a worker, the example prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
exec .venv/bin/python -m producer demo "$@"
