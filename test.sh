#!/usr/bin/env bash
# The test suite: installs what is missing (scripts/install.sh), then runs pytest on tests/.
# Extra arguments go to pytest, e.g. ./test.sh -x -k hints. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/install.sh
exec "$PY" -m pytest -q tests "$@"
