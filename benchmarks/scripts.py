"""Horovod's own PyTorch example, changed as the README says, against the same script with Synchronous.

    PYTHONPATH=. .venv/bin/python benchmarks/scripts.py [--repeats 3] [--epochs 10] [--strategies esync,elasticbsp]
    (make bench-scripts)

``benchmarks/horovod_examples/pytorch_mnist.py`` is Horovod's ``examples/pytorch/pytorch_mnist.py``
unchanged; ``readme_change`` applies the README's diff to it (the import, ``hh.DistributedSampler`` for
the training sampler, ``hh.DistributedOptimizer`` with ``named_buffers`` and the strategy, and
``optimizer.sync_model()`` at each epoch's end) and nothing else, so the Synchronous baseline is the
same changed script with ``hh.Synchronous()`` (which *is* ``hvd.DistributedOptimizer``, under the same
simulated slowdown). Fashion-MNIST stands in for MNIST (``horovod_examples/README.md``).

4 workers under ``horovodrun --gloo``, ``HOROVOD_HETERO_SLOWDOWN=1,1,1,4`` with every step padded to
factor x ``--base-step`` (0.05 s). Each run's time is rank 0's, from its first logged step (every rank
is past ``hvd.init`` and the broadcasts) to its last test result; the whole job's wall time is printed
beside it. Ratios are Synchronous's time over each strategy's within one repeat; the summary gives
their median over the repeats, and the final test accuracy of each.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(HERE, "horovod_examples", "pytorch_mnist.py")
SHIM = os.path.join(HERE, "horovod_examples", "shim")
STRATEGIES = {"sync": "hh.Synchronous()", "esync": "hh.ESync()", "elasticbsp": "hh.ElasticBSP()",
              "localsgd": "hh.LocalSGD(period=8)", "dssp": "hh.DSSP()"}

#: (what the line was, what the README makes it): each must match exactly once
EDITS = [
    ("import horovod.torch as hvd\n", "import horovod.torch as hvd\nimport horovod_hetero.torch as hh\n"),
    ("    train_sampler = torch.utils.data.distributed.DistributedSampler(\n"
     "        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())\n",
     "    train_sampler = hh.DistributedSampler(\n"
     "        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())\n"),
    ("    optimizer = hvd.DistributedOptimizer(optimizer,\n"
     "                                         named_parameters=model.named_parameters(),\n",
     "    optimizer = hh.DistributedOptimizer(optimizer,\n"
     "                                         named_parameters=model.named_parameters(),\n"
     "                                         named_buffers=model.named_buffers(), strategy=STRATEGY,\n"),
    # at the end of each epoch (after the loop) of both training paths
    ("100. * batch_idx / len(train_loader), loss.item(), scaler.get_scale()))\n",
     "100. * batch_idx / len(train_loader), loss.item(), scaler.get_scale()))\n        optimizer.sync_model()\n"),
    ("100. * batch_idx / len(train_loader), loss.item()))\n",
     "100. * batch_idx / len(train_loader), loss.item()))\n        optimizer.sync_model()\n"),
]


def readme_change(source, strategy):
    """Horovod's script with the README's change and ``strategy`` (an expression) as the strategy."""
    for old, new in EDITS:
        if source.count(old) != 1:
            raise ValueError(f"the example no longer has exactly one {old.strip()!r}")
        source = source.replace(old, new)
    return source.replace("strategy=STRATEGY", f"strategy={strategy}")


def run(name, args):
    """(rank 0's training seconds, the job's seconds, the last test accuracy in %)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "pytorch_mnist.py")
        with open(EXAMPLE) as f:
            changed = readme_change(f.read(), STRATEGIES[name])
        with open(script, "w") as f:
            f.write(changed)
        env = dict(os.environ, HOROVOD_HETERO_SLOWDOWN=args.slowdown, HOROVOD_HETERO_BASE_STEP_S=str(args.base_step),
                   HH_EXAMPLE_TRAIN_SAMPLES=str(args.train_samples),
                   PYTHONPATH=os.pathsep.join([SHIM, ROOT, os.environ.get("PYTHONPATH", "")]))
        cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(args.np), "-H",
               f"localhost:{args.np}", "--gloo", sys.executable, script, "--epochs", str(args.epochs),
               "--data-dir", d, "--log-interval", "1000"]
        start = time.monotonic()
        first = last = accuracy = None
        lines = []
        with subprocess.Popen(cmd, env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
            for line in p.stdout:
                lines.append(line)
                if first is None and line.startswith("[0]<stdout>:Train Epoch: 1 [0/"):
                    first = time.monotonic()
                found = re.search(r"Test set: Average loss: [\d.]+, Accuracy: ([\d.]+)%", line)
                if found:
                    last, accuracy = time.monotonic(), float(found.group(1))
        if p.returncode != 0 or first is None or last is None:
            sys.exit(f"{name}: the script failed ({p.returncode}):\n{''.join(lines[-40:])}")
        return last - first, last - start, accuracy


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="esync,elasticbsp")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--train-samples", type=int, default=12000, help="the first N of Fashion-MNIST's 60,000")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--slowdown", default="1,1,1,4")
    p.add_argument("--base-step", type=float, default=0.05)
    args = p.parse_args()
    ratios, accuracy = {}, {}
    for rep in range(args.repeats):
        base, job, acc = run("sync", args)
        accuracy.setdefault("sync", []).append(acc)
        print(f"[{rep}] Synchronous: {base:.1f} s training ({job:.1f} s job), test accuracy {acc:.2f}%", flush=True)
        for name in args.strategies.split(","):
            t, job, acc = run(name, args)
            ratios.setdefault(name, []).append(t / base)
            accuracy.setdefault(name, []).append(acc)
            print(f"[{rep}] {name}: {t:.1f} s training ({job:.1f} s job), {t / base:.2f}x Synchronous's time, "
                  f"test accuracy {acc:.2f}%", flush=True)
    print(f"Horovod's pytorch_mnist.py, {args.epochs} epochs of {args.train_samples} Fashion-MNIST images, "
          f"{args.np} workers, slowdown {args.slowdown} ({args.base_step} s steps); medians of {args.repeats}:")
    print(f"  sync: test accuracy {statistics.median(accuracy['sync']):.2f}%")
    for name, r in ratios.items():
        print(f"  {name}: {statistics.median(r):.2f}x Synchronous's time (range {min(r):.2f}-{max(r):.2f}), "
              f"test accuracy {statistics.median(accuracy[name]):.2f}%")


if __name__ == "__main__":
    main()
