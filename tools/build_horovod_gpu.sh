#!/usr/bin/env bash
# Build and install Horovod 0.28.1 with NCCL (GPU operations), Gloo and PyTorch into the Python
# environment of $PY, from the sdist SDIST (a .tar.gz): what `GPU=1 make env` does where nvcc and a
# CUDA build of PyTorch exist, and what the GPU machine's check runs (tools/device_gpu_check.sh).
#
# NCCL comes from the nvidia-nccl wheel that CUDA builds of PyTorch install (its headers and library;
# the library has no unversioned name, so a link is made for CMake). Kernels are built for the
# compute capability of this machine's GPU (HOROVOD_BUILD_CUDA_CC_LIST, default: the first GPU's), and
# the CUDA standard is raised to C++17 (CUDA 13's headers need it; Horovod 0.28.1 asks for C++11).
set -euo pipefail
SDIST="$1"
PY="${PY:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
log() { printf '[gpu-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if ! command -v nvcc >/dev/null || ! "$PY" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
  echo "GPU=1: no nvcc or no CUDA build of PyTorch here: Horovod is built for the CPU only"
  exit 3
fi
nccl=$("$PY" -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
work=$(mktemp -d)
mkdir -p "$work/lib"
ln -s "$(ls "$nccl"/lib/libnccl.so* | head -n1)" "$work/lib/libnccl.so"
cc=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PY" -c "import torch; print('%d%d' % torch.cuda.get_device_capability(0))")}
tar xzf "$SDIST" -C "$work"
src=$(ls -d "$work"/horovod-*/)
sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
log "building $(basename "$src") with NCCL ($nccl) for sm_$cc, nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
# GCC 13 no longer includes <string>, <cstdint>, <stdexcept>... through other headers, which Horovod 0.28.1 relies on
export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept -include cstring -include limits -include memory -include functional -include algorithm" HOROVOD_HETERO_REAL_CXX="${CXX:-c++}" CXX="$ROOT/tools/cxx17" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
       MAKEFLAGS="-j$(nproc)" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo HOROVOD_GPU_OPERATIONS=NCCL \
       HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$work/lib" HOROVOD_NCCL_LINK=SHARED \
       HOROVOD_CUDA_HOME="$(dirname "$(dirname "$(command -v nvcc)")")" HOROVOD_BUILD_CUDA_CC_LIST="$cc"
"$PY" -m pip install --no-deps --no-build-isolation --no-cache-dir -q "$src"
log "built"
"$PY" -c "import horovod.torch as hvd; print('NCCL built:', hvd.nccl_built())"
