#!/usr/bin/env bash
# make test-gpu: tests/gpu under horovodrun, one rank per GPU (NCCL puts no two ranks of one
# communicator on one GPU). Where there is no CUDA GPU, or Horovod was built without NCCL, it says
# so in one line and exits 0: CI has no GPU, and nothing may depend on one.
set -euo pipefail
PY="${PY:-.venv/bin/python}"
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$gpus" = 0 ]; then
  echo "test-gpu: skipped, no CUDA GPU here (torch.cuda.is_available() is False)"
  exit 0
fi
if ! "$PY" -c "import sys, horovod.torch as hvd; sys.exit(0 if hvd.nccl_built() else 1)"; then
  echo "test-gpu: skipped, Horovod is built without NCCL (build it with GPU=1 make env)"
  exit 0
fi
echo "test-gpu: $gpus GPU(s): $("$PY" -c "import torch; print(torch.cuda.get_device_name())"), one rank each"
if [ "$gpus" = 1 ]; then            # one rank: hvd.init() needs no launcher
  exec "$PY" -m pytest -q -s -p no:cacheprovider tests/gpu
fi
exec "$(dirname "$PY")/horovodrun" -np "$gpus" -H "localhost:$gpus" --gloo \
  "$PY" -m pytest -q -s -p no:cacheprovider tests/gpu
