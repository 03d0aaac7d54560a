#!/usr/bin/env bash
# Create or update .venv with PyTorch, TensorFlow, Horovod (Gloo) and this package (make runs it when needed).
# The Horovod wheel is built once per user and cached, keyed by the versions it is built against.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
TF_VERSION=2.15.1
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/horovod-hetero/horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-tf${TF_VERSION}"
STAMP="$VENV/.horovod-hetero-ready"

log() { printf '[bootstrap %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

log "installing PyTorch $TORCH_VERSION, TensorFlow $TF_VERSION and the tools"
# pip warns about every package the machine's extra local indexes lack: keep the log readable
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet "${PIP[@]}" install -q --upgrade "pip<25" "setuptools<75" wheel
quiet "${PIP[@]}" install -q -r "$ROOT/tools/requirements.txt"

wheel=$(ls "$CACHE"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  log "building Horovod $HOROVOD_VERSION with Gloo, PyTorch and TensorFlow (10-20 min, once per user)"
  mkdir -p "$CACHE"
  tmp=$(mktemp -d)
  export PATH="$VENV/bin:$PATH"
  (
    export HOROVOD_HETERO_REAL_CXX="${CXX:-c++}"   # the wrapper hands the real work to this
    export CXX="$ROOT/tools/cxx17" \
           CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
           HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
           HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo
    quiet "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -w "$tmp" "horovod==$HOROVOD_VERSION"
  )
  mv "$tmp"/horovod-*.whl "$CACHE"/
  rm -rf "$tmp"
  wheel=$(ls "$CACHE"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
else
  log "using cached Horovod wheel $wheel"
fi
quiet "${PIP[@]}" install -q "$wheel"
quiet "${PIP[@]}" install -q --no-deps -e "$ROOT"

log "checking the Horovod build"
check=$("$VENV/bin/horovodrun" --check-build)
echo "$check"
for fw in TensorFlow PyTorch Gloo; do
  if ! echo "$check" | grep -q "\[X\] $fw"; then
    echo "Horovod was built without $fw; remove $CACHE and run again" >&2
    exit 1
  fi
done
touch "$STAMP"
log "environment ready in $(( $(date +%s) - start )) s"
