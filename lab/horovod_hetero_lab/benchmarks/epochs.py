"""Time per epoch of ``examples/torch_mnist.py``: torch's sampler with Synchronous against hh's with strategies.

The checkout's ``examples/torch_mnist.py`` is a CPU script in the shape of Horovod's PyTorch MNIST example:
Synchronous with torch's ``DistributedSampler`` against the strategies with ``hh.DistributedSampler``, same run.

    horovod-hetero benchmark epochs [--repeats 2] [--slowdown 1,1,1,4]    (make bench-epochs)

4 workers under ``horovodrun --gloo``, slowdown 1,1,1,4 with every step padded to factor x
``--base-step`` (0.1 s, like the demo: an accelerator's step; steadier on shared cores), digits, batch 16. The first epoch is split evenly (no
speed is measured before it), so the figure is the median epoch time from the second epoch on;
ratios are Synchronous's over each strategy's, within one repetition.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from horovod_hetero_lab import example


def run(strategy, sampler, args):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, HOROVOD_HETERO_SLOWDOWN=args.slowdown, HOROVOD_HETERO_BASE_STEP_S=str(args.base_step))
        cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(args.np), "-H",
               f"localhost:{args.np}", "--gloo", sys.executable, str(example("torch_mnist")),
               "--strategy", strategy, "--sampler", sampler, "--epochs", str(args.epochs), "--result", out.name]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(out.name))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="esync,elasticbsp,dssp")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--slowdown", default="1,1,1,4")
    p.add_argument("--base-step", type=float, default=0.1)
    args = p.parse_args(argv)
    ratios: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        sync = run("sync", "torch", args)
        base = statistics.median(sync["epoch_s"][1:])
        print(f"[{rep}] Synchronous, torch sampler: {base:.2f} s/epoch, test acc {sync['test_loss_accuracy'][1]:.3f}",
              flush=True)
        for strategy in args.strategies.split(","):
            result = run(strategy, "hh", args)
            epoch = statistics.median(result["epoch_s"][1:])
            ratios.setdefault(strategy, []).append(base / epoch)
            print(f"[{rep}] {result['strategy']}, hh sampler: {epoch:.2f} s/epoch ({base / epoch:.2f}x less than "
                  f"Synchronous), rank 0's batches per epoch {result['batches']}, test acc "
                  f"{result['test_loss_accuracy'][1]:.3f}", flush=True)
    for strategy, r in ratios.items():
        print(f"{strategy}: time per epoch {statistics.median(r):.2f}x less than Synchronous "
              f"(median of {len(r)}, range {min(r):.2f}-{max(r):.2f})")


if __name__ == "__main__":
    main()
