#!/usr/bin/env bash
# Run the parallel test tier under horovodrun (Gloo) and print rank 0's pytest report.
# Usage: tools/run_parallel.sh NP TEST_FILE... ; the whole job is bounded by PARALLEL_TIMEOUT seconds.
set -uo pipefail
np="$1"; shift
VENV="${VENV:-.venv}"
log=$(mktemp)
timeout "${PARALLEL_TIMEOUT:-1200}" "$VENV/bin/horovodrun" -np "$np" -H "localhost:$np" --gloo \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --timeout 240 "$@" >"$log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  sed -n 's/^\[0\]<stdout>://p' "$log"
else
  cat "$log"
  echo "parallel tests failed under horovodrun -np $np (exit $rc)" >&2
fi
rm -f "$log"
exit $rc
