#!/usr/bin/env bash
# Install (scripts/install.sh) and run the whole test suite, slow tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
bash scripts/install.sh
. .venv/bin/activate
set +e
python -m pytest -q --durations=15 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
