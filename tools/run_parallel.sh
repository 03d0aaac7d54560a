#!/usr/bin/env bash
# Run the parallel test tier under a Horovod launcher and print rank 0's pytest report.
# Usage: [LAUNCHER=gloo|mpi|mpirun] tools/run_parallel.sh NP TEST_FILE... ; the whole job is bounded by
# PARALLEL_TIMEOUT seconds. LAUNCHER: horovodrun --gloo (default), horovodrun --mpi (both tools/horovodrun:
# Horovod's launcher, its build check answered from a cache), or Open MPI's own mpirun (as srun or a
# cluster's scheduler starts the ranks: no horovodrun at all).
set -uo pipefail
np="$1"; shift
VENV="${VENV:-.venv}"
export PATH="$VENV/bin:$PATH"                  # horovodrun --mpi runs the mpirun it finds on PATH
LAUNCHER="${LAUNCHER:-gloo}"
horovodrun=("$VENV/bin/python" "$(dirname "$0")/horovodrun")
case "$LAUNCHER" in
  gloo) launch=("${horovodrun[@]}" -np "$np" -H "localhost:$np" --gloo) ;;
  # Open MPI 5's mpirun refuses the single-dash -bind-to/-map-by horovodrun passes by default
  mpi) launch=("${horovodrun[@]}" -np "$np" -H "localhost:$np" --mpi --binding-args="--bind-to none --map-by slot") ;;
  # -H localhost:NP: NP slots on this host whatever its cores; --bind-to none: 4 ranks may share 2 cores
  mpirun) launch=("$VENV/bin/mpirun" -np "$np" -H "localhost:$np" --bind-to none --tag-output
                  $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )) ;;
  *) echo "LAUNCHER must be gloo, mpi or mpirun, got $LAUNCHER" >&2; exit 2 ;;
esac
# more ranks than cores (4 on CI's 2): a rank waiting in MPI yields its core instead of polling it (Open
# MPI polls when -H gives it a slot per rank; under --gloo nothing polls)
[ "$np" -gt "$(nproc)" ] && export OMPI_MCA_mpi_yield_when_idle=1
log=$(mktemp)
# the job is a row of make test's timing table (tools/timed): PARALLEL_JOB or the files, the launcher,
# the Keras stack
job="${PARALLEL_JOB:-$*}${LAUNCHER:+ [$LAUNCHER]}${KERAS_BACKEND:+ [KERAS_BACKEND=$KERAS_BACKEND]}${TF_USE_LEGACY_KERAS:+ [Keras 2]}"
"$(dirname "$0")/timed" "$job" timeout "${PARALLEL_TIMEOUT:-1200}" "${launch[@]}" \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider --color=no --timeout 240 "$@" >"$log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  # rank 0's lines: [0]<stdout>: under Gloo, [1,0]<stdout>: (job, rank) under MPI
  sed -n -E 's/^\[([0-9]+,)?0\]<stdout>: ?//p' "$log"
else
  cat "$log"
  echo "parallel tests failed under $LAUNCHER -np $np (exit $rc)" >&2
fi
rm -f "$log"
exit $rc
