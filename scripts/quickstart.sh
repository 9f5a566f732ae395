#!/usr/bin/env bash
# Install (scripts/install.sh) and run the quickstart: GRPO on SmolLM2-135M-Instruct.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
bash scripts/install.sh
. .venv/bin/activate
# --report: at the end, write the dashboard PNG (reward, KL, entropy, length, grad norm,
# throughput) and a markdown summary next to metrics.jsonl, and print where they are.
temper train examples/quickstart.yaml --report "$@"
