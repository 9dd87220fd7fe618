#!/usr/bin/env bash
# The test suite: installs what is missing (scripts/install.sh), then runs pytest on tests/, one
# worker process per core (pytest-xdist; at most 8: most tests start processes of their own).
# Extra arguments go to pytest, e.g. ./test.sh -x -k hints (-n 0: in this process, one at a time).
# CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/install.sh
exec "$PY" -m pytest -q -n auto --maxprocesses 8 tests "$@"
