#!/usr/bin/env bash
# The checks a lent GPU machine runs (see tests/gpu): the CUDA tests, the one-GPU engine
# benchmark, then the tiny RLVR end-to-end runs on CUDA. The machine has torch but not all
# of temper's dependencies: the missing ones travel as wheels in .whl, which
# scripts/gpu_wheels.sh downloads here (carry .whl in the device call).
# Usage there: bash scripts/gpu_check.sh   (writes logs to $OUT when it is set)
set -uo pipefail
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
timeout 230 python3 -m pytest tests/gpu -q -rA -p no:cacheprovider --durations=10 2>&1 \
  | tee "$out/gpu_tests.log"
timeout 90 python3 benchmarks/gpu_engines.py 2>&1 | tee "$out/gpu_engines.log"
timeout 200 python3 -m pytest tests/integration/test_rlvr_tiny.py -q -rA -x -p no:cacheprovider \
  --durations=10 2>&1 | tee "$out/rlvr_tiny_cuda.log"
