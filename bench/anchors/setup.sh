#!/usr/bin/env bash
# The anchors' environments, one per tool (their pins conflict with ours and with each other:
# llm-analysis pins transformers 4.31). CPU torch first (a local wheel here), so nothing pulls CUDA.
#   bash bench/anchors/setup.sh DIR      # -> DIR/{anchors,ds,lla}-venv; then TRAINFIT_ANCHORS_VENVS=DIR
set -euo pipefail
ROOT=${1:?usage: bash bench/anchors/setup.sh DIR (the folder for the tools' venvs)}
python3 -m venv "$ROOT/anchors-venv"
"$ROOT/anchors-venv/bin/pip" install -q torch==2.13.0
"$ROOT/anchors-venv/bin/pip" install -q accelerate transformers==5.23.0 numpy
python3 -m venv "$ROOT/ds-venv"
"$ROOT/ds-venv/bin/pip" install -q torch==2.13.0 numpy
DS_BUILD_OPS=0 "$ROOT/ds-venv/bin/pip" install -q deepspeed   # pure-Python install: no CUDA ops are built
python3 -m venv "$ROOT/lla-venv"
"$ROOT/lla-venv/bin/pip" install -q llm-analysis              # needs no torch
echo "anchors: $ROOT/anchors-venv (accelerate), $ROOT/ds-venv (deepspeed), $ROOT/lla-venv (llm-analysis); export TRAINFIT_ANCHORS_VENVS=$ROOT"
