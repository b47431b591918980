#!/usr/bin/env bash
# .trainers: a venv with the drafter trainers (SpecForge 0.2.0, speculators 0.9.0) on CPU torch, for
# scripts/check_trainers.py. Apart from the project's .venv: SpecForge pins torch 2.11 and sglang,
# which its pre-tokenized path never imports, so both are installed without their pinned deps and
# with only what their data-loading code imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -d .trainers ] || "$PYTHON" -m venv .trainers
.trainers/bin/python -m pip install --quiet --upgrade pip
# torch first: where pip finds a local CPU wheel (this project's machines) no CUDA build is downloaded
.trainers/bin/python -m pip install --quiet torch==2.13.0
.trainers/bin/python -m pip install --quiet --no-deps specforge==0.2.0 speculators==0.9.0
.trainers/bin/python -m pip install --quiet "datasets>=4.0.0,<=5.1.0" "transformers>=5.0.0,<=5.19.0" \
  huggingface-hub "loguru>=0.7.2,<=0.7.3" "openai>=2.0.0" hs-connectors==0.9.0 pydantic pydantic-settings \
  rich typer safetensors tqdm "numpy>=2.0,<=2.5.4" aiohttp httpx psutil protobuf pyyaml
