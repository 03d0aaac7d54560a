#!/usr/bin/env bash
# The GPU machine's check, for a session lent one (one GPU, no network): Horovod built with NCCL into
# that machine's python3 from the carried sdist, `make test-gpu`, then Horovod's own pytorch_mnist.py
# changed as the README says (the edits of the lab's `benchmark scripts`) on its mixed-precision path
# (--use-mixed-precision: CUDA's GradScaler and autocast, synchronize, skip_synchronize), one rank on
# the GPU, for Synchronous and each model-averaging torch strategy; with --fp16-allreduce as well,
# Synchronous trains and each model-averaging strategy refuses `compression=` by name when built (it
# averages the model itself, in its own dtype: docs/pytorch.md).
#
# What it needs beside the checkout, in DIR (default .devcarry, git-ignored, carried): Horovod's sdist
# horovod-0.28.1.tar.gz, the cffi and pycparser wheels for the machine's Python (Horovod's build needs
# cffi) and data/fashion-mnist (the set-up's copy). Prepare it here with `tools/device_gpu_check.sh
# --prepare`; on the machine run `tools/device_gpu_check.sh` (logs under $OUT when it is set).
set -euo pipefail
DIR="${DIR:-.devcarry}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
log() { printf '[device %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ "${1:-}" = --prepare ]; then
  mkdir -p "$DIR/data"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$DIR" horovod==0.28.1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR" cffi pycparser
  cp -r "${XDG_CACHE_HOME:-$HOME/.cache}/horovod-hetero/data/fashion-mnist" "$DIR/data/"
  du -sh "$DIR"
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --target /tmp/site "$DIR"/*.whl
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" HOROVOD_HETERO_DATA="$ROOT/$DIR/data"
log "building Horovod with NCCL"
PY=python3 bash tools/build_horovod_gpu.sh "$DIR/horovod-0.28.1.tar.gz"
python3 -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
python3 -m pip install -q --no-deps --no-build-isolation -e "$ROOT/lab"    # the edits (benchmark scripts), the shim's Fashion-MNIST
log "make test-gpu"
PY=python3 bash tools/test_gpu.sh
log "Horovod's pytorch_mnist.py, mixed precision, on the GPU"
python3 - <<'EOF'
import os, re, subprocess, sys, tempfile, time
from horovod_hetero_lab import horovod_example
from horovod_hetero_lab.benchmarks.scripts import original, torch_script

source = original("pytorch_mnist.py")
env = dict(os.environ, HH_EXAMPLE_TRAIN_SAMPLES="12000",
           PYTHONPATH=os.pathsep.join([str(horovod_example("shim")), os.getcwd(), os.environ["PYTHONPATH"]]))
failed = []
for flags in (["--use-mixed-precision"], ["--use-mixed-precision", "--fp16-allreduce"]):
    for strategy in ("sync", "esync", "elasticbsp", "localsgd", "dssp"):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "pytorch_mnist.py")
            open(script, "w").write(torch_script(source, strategy))
            start = time.monotonic()
            p = subprocess.run([sys.executable, script, "--epochs", "2", "--data-dir", d, "--log-interval", "50",
                                *flags], cwd=d, env=env, capture_output=True, text=True, timeout=300)
            acc = re.findall(r"Accuracy: ([\d.]+)%", p.stdout)
            scale = re.findall(r"Loss Scale: ([\d.]+)", p.stdout)
            print(f"{strategy:10s} {' '.join(flags):40s} rc={p.returncode} {time.monotonic() - start:5.1f} s "
                  f"test accuracy per epoch {acc} last loss scale {scale[-1:]}", flush=True)
            if "--fp16-allreduce" in flags and strategy != "sync":     # refused by name, when built
                ok = p.returncode != 0 and "ValueError: compression: Horovod's options" in p.stderr
            else:
                ok = p.returncode == 0 and len(acc) == 2 and bool(scale)
            if not ok:
                failed.append((strategy, flags))
                print(p.stdout[-2000:], p.stderr[-4000:], sep="\n")
sys.exit(f"failed: {failed}" if failed else 0)
EOF
log "done"
