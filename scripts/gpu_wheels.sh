#!/usr/bin/env bash
# The wheels a lent GPU machine lacks (its image has torch, transformers, peft, pandas,
# pyarrow, xxhash, ...; no network): downloaded here into .whl for scripts/gpu_check.sh,
# which installs them there. Run from the repository root; .whl is kept out of git.
# Usage: bash scripts/gpu_wheels.sh   (then carry .whl in the device call)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
# pinned like pyproject.toml: hydra pins omegaconf 2.3 and antlr4 4.9.*; megatron-core 0.16
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl \
  tensordict pyvers "hydra-core>=1.3.2,<1.4" "omegaconf==2.3.0" math-verify \
  latex2sympy2_extended gguf "megatron-core>=0.16.1,<0.17" liger-kernel
# antlr4-python3-runtime 4.9.3 is a source package only: build its (pure Python) wheel
python3 -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
ls .whl
