#!/usr/bin/env bash
# Install (scripts/install.sh), run the whole test suite (slow tests included), then the
# type check of the package (mypy; its settings are in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
bash scripts/install.sh
. .venv/bin/activate
set +e
python -m pytest -q --durations=15 "$@"
status=$?
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
