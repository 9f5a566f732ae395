#!/usr/bin/env bash
# Install (scripts/install.sh), run the whole test suite (slow tests included), then the
# type check of the package (mypy; its settings are in pyproject.toml).
#
# The integration modules of the training and rollout engines (and the two that train
# ROLL files on them) each run in a pytest process of their own, the rest of the suite
# in one: a module must pass as `pytest path/to/that_file.py` runs it, not only after
# another module has set up the process (a process group, a library's state). They are
# not run twice: the cost is one pytest start-up per module.
# With arguments (`bash scripts/test.sh tests/unit -x`), pytest runs those as given.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
bash scripts/install.sh
. .venv/bin/activate
ALONE=(
  tests/integration/test_deepspeed.py
  tests/integration/test_deepspeed_runs.py
  tests/integration/test_deepspeed_master_dtype.py
  tests/integration/test_megatron*.py  # every Megatron module: its parallel state is per process
  tests/integration/test_fsdp2.py
  tests/integration/test_vllm.py
  tests/integration/test_agentic_tiny.py
  tests/integration/test_dialect_examples.py
)
set +e
if [ "$#" -gt 0 ]; then
  python -m pytest -q --durations=15 "$@"
  status=$?
else
  ignore=()
  for module in "${ALONE[@]}"; do
    ignore+=("--ignore=$module")
  done
  python -m pytest -q --durations=15 "${ignore[@]}"
  status=$?
  for module in "${ALONE[@]}"; do
    echo "== $module, alone"
    python -m pytest -q "$module"
    alone=$?
    if [ "$alone" -ne 0 ] && [ "$status" -eq 0 ]; then
      status=$alone
    fi
  done
fi
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
python -m mypy
typed=$?
set -e
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
exit "$typed"
