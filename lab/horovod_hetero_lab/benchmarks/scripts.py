"""Horovod's own example scripts, changed as the README says, against the same scripts with Synchronous.

    horovod-hetero benchmark scripts [--examples pytorch,keras] [--repeats 3]
        [--strategies esync,elasticbsp] [--keras-stacks tensorflow,torch,keras2]
    (make bench-scripts)

``lab/horovod_examples/`` (data files of the lab: ``horovod_hetero_lab.horovod_example``) holds Horovod's
``examples/pytorch/pytorch_mnist.py`` and ``examples/tensorflow2/tensorflow2_keras_mnist.py`` unchanged; the
edits below are applied as text, each asserted to find what it changes, and nothing else is changed.
Fashion-MNIST stands in for MNIST (``lab/horovod_examples/README.md``). 4 workers under
``horovodrun --gloo``, ``HOROVOD_HETERO_SLOWDOWN=1,1,1,4`` with every step padded to factor x a base step.

PyTorch: the README's diff (the import, ``hh.DistributedSampler`` for the training sampler with the
loader's batch size,
``hh.DistributedOptimizer`` with ``named_buffers`` and the strategy, ``optimizer.sync_model()`` at each
epoch's end); Synchronous is the same changed script with ``hh.Synchronous()``, which *is*
``hvd.DistributedOptimizer``. Time: rank 0's, from its first logged step to its last test result.

Keras: the script as Horovod wrote it needs, before any strategy (Synchronous too), what Horovod 0.28.1
cannot do beside Keras 3: hh's callbacks on every Keras (``CALLBACKS``: Horovod's use the ``keras``
package, Keras 3 even under ``TF_USE_LEGACY_KERAS=1``), and on Keras 3 no
``experimental_run_tf_function`` and hh's optimizer (``KERAS3``; ``horovod.torch`` under
``KERAS_BACKEND=torch``). Then
the README's change: the strategy callback after the broadcast, the optimizer left local (``hh.Auto``'s
callback keeps ``hh.DistributedOptimizer``, whose average it switches on and off: Keras 3 only, so the Keras 2
stack runs no Auto); Synchronous gets ``hh.callbacks.SlowdownCallback()`` there, the same simulated cluster. ``SCALE`` fits the run to
this machine's 2 cores shared by 4 ranks, every configuration alike (batch 32, 200 // size steps per
epoch, ``--keras-epochs``): at the script's batch of 128 a step computes longer than the padding, and
no rank would be slower than another. Time: rank 0's, from its first epoch's start to its last epoch's
summary line (every rank has met at that epoch's end); the job's wall time is printed beside it (with
shares, TensorFlow's tf.data iterator can take many seconds to be torn down at the interpreter's exit).
The test accuracy is rank 0's last checkpoint evaluated after the job, on Fashion-MNIST's 10,000 test
images.

Ratios are each strategy's time over Synchronous's within one repeat; the summary gives their median
over the repeats, each configuration's median test accuracy, and Auto's time over the fastest fixed
strategy's (by the median) per repeat.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from horovod_hetero_lab import horovod_example

TORCH_STRATEGIES = {"sync": "hh.Synchronous()", "esync": "hh.ESync()", "elasticbsp": "hh.ElasticBSP()",
                    "localsgd": "hh.LocalSGD(period=8)", "dssp": "hh.DSSP()", "auto": "hh.Auto()"}
KERAS_CALLBACKS = {"sync": "hh.callbacks.SlowdownCallback()", "esync": "hh.callbacks.ESyncCallback()",
                   "elasticbsp": "hh.callbacks.ElasticBSPCallback()",
                   "localsgd": "hh.callbacks.LocalSGDCallback(period=8)", "dssp": "hh.callbacks.DSSPCallback()",
                   "auto": "hh.callbacks.AutoCallback()"}
#: the strategies whose Keras model keeps ``hh.DistributedOptimizer``: Synchronous's average, and the average
#: Auto switches on and off (Keras 3 only)
KERAS_AVERAGED = ("sync", "auto")
#: the environment of each Keras stack
KERAS_STACKS = {"tensorflow": {"KERAS_BACKEND": "tensorflow"}, "torch": {"KERAS_BACKEND": "torch"},
                "keras2": {"TF_USE_LEGACY_KERAS": "1"}}

#: (what the line was, what the README makes it): each must match exactly once
TORCH_EDITS = [
    ("import horovod.torch as hvd\n", "import horovod.torch as hvd\nimport horovod_hetero.torch as hh\n"),
    ("    train_sampler = torch.utils.data.distributed.DistributedSampler(\n"
     "        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())\n",
     "    train_sampler = hh.DistributedSampler(\n"
     "        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), loader_batch_size=args.batch_size)\n"),
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

KERAS_IMPORT = "import horovod.tensorflow.keras as hvd\n"
KERAS_OPTIMIZER = "    opt = hvd.DistributedOptimizer(\n        opt, backward_passes_per_step=1, average_aggregated_gradients=True)\n"
KERAS_BROADCAST = "        hvd.callbacks.BroadcastGlobalVariablesCallback(0),\n"
#: what Keras 3 needs of Horovod's script before any strategy (Synchronous too)
KERAS3 = [
    ("                        metrics=['accuracy'],\n                        experimental_run_tf_function=False)\n",
     "                        metrics=['accuracy'])\n"),
    (KERAS_OPTIMIZER, KERAS_OPTIMIZER.replace("hvd.", "hh.")),
]
#: what every Keras needs where Keras 3 is installed: Horovod 0.28.1's Keras callbacks use the ``keras``
#: package, Keras 3 there even under ``TF_USE_LEGACY_KERAS=1`` (its warm-up raises on ``get_value``)
CALLBACKS = [("hvd.callbacks.", "hh.callbacks.", 3)]
#: the run fitted to this machine (every configuration alike)
SCALE = [(".batch(128)", ".batch(32)"), ("steps_per_epoch=500 // hvd.size()", "steps_per_epoch=200 // hvd.size()"),
         ("epochs=24,", "epochs=EPOCHS,")]


def edited(source, edits):
    """``source`` with every ``(old, new[, count])`` applied; a ``ValueError`` if ``old`` is not there
    exactly ``count`` (1) times."""
    for old, new, *count in edits:
        if source.count(old) != (count[0] if count else 1):
            raise ValueError(f"the example no longer has {count[0] if count else 'exactly one'} {old.strip()!r}")
        source = source.replace(old, new)
    return source


def torch_script(source, strategy):
    """Horovod's PyTorch script with the README's change and ``strategy`` (a name) as the strategy."""
    return edited(source, TORCH_EDITS).replace("strategy=STRATEGY", f"strategy={TORCH_STRATEGIES[strategy]}")


def keras_script(source, strategy, stack, epochs):
    """Horovod's Keras script for ``stack`` (Keras 3 first made to run there) with the README's change:
    the callback of ``strategy`` after the broadcast, and a local optimizer for a model-averaging one."""
    keras3 = stack != "keras2"
    edits = SCALE + CALLBACKS + (KERAS3 if keras3 else [])
    edits.append((KERAS_IMPORT, ("import horovod.torch as hvd\n" if stack == "torch" else KERAS_IMPORT)
                  + "import horovod_hetero.keras as hh\n"))
    broadcast = KERAS_BROADCAST.replace("hvd.", "hh.")
    edits.append((broadcast, broadcast + f"        {KERAS_CALLBACKS[strategy]},\n"))
    if strategy not in KERAS_AVERAGED:           # the strategy averages the models: the optimizer stays local
        edits.append((KERAS_OPTIMIZER.replace("hvd.", "hh." if keras3 else "hvd."), ""))
    return edited(source, edits).replace("epochs=EPOCHS,", f"epochs={epochs},")


def original(name):
    """Horovod's example script ``name``, unchanged (``horovod_hetero_lab.horovod_example``)."""
    return horovod_example(name).read_text()


def python_path(*first):
    """``PYTHONPATH`` with ``first`` before this process's own (the library and the lab come from their install)."""
    return os.pathsep.join([*first, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def launch(script, args, d, extra_env, script_args=()):
    """Run ``script`` on ``args.np`` ranks, the shim first on its path; (its output lines with their arrival
    times, the job's end)."""
    env = dict(os.environ, HOROVOD_HETERO_SLOWDOWN=args.slowdown, HOROVOD_HETERO_BASE_STEP_S=str(args.base_step),
               HH_EXAMPLE_TRAIN_SAMPLES=str(args.train_samples), PYTHONPATH=python_path(str(horovod_example("shim"))),
               **extra_env)
    env.pop("HOROVOD_HETERO_SAMPLE_S", None)     # Horovod's scripts report no batch sizes: padded steps only
    cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(args.np), "-H",
           f"localhost:{args.np}", "--gloo", sys.executable, script, *script_args]
    lines = []
    with subprocess.Popen(cmd, env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append((time.monotonic(), line))
    end = time.monotonic()
    if p.returncode != 0:
        sys.exit(f"{script}: failed ({p.returncode}):\n{''.join(line for _, line in lines[-40:])}")
    return lines, end


def first(lines, prefix):
    """The time of rank 0's first output line that starts with ``prefix``."""
    for at, line in lines:
        if line.startswith("[0]<stdout>:" + prefix):
            return at
    sys.exit(f"no line of rank 0 starts with {prefix!r}:\n{''.join(line for _, line in lines[-40:])}")


def run_torch(strategy, args):
    """(rank 0's training seconds, the job's seconds, the last test accuracy in %)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "pytorch_mnist.py")
        with open(script, "w") as out:
            out.write(torch_script(original("pytorch_mnist.py"), strategy))
        start = time.monotonic()
        lines, _ = launch(script, args, d, {}, ["--epochs", str(args.epochs), "--data-dir", d,
                                                "--log-interval", "1000"])
        begin = first(lines, "Train Epoch: 1 [0/")
        found = [(at, float(m.group(1))) for at, line in lines
                 if (m := re.search(r"Test set: Average loss: [\d.]+, Accuracy: ([\d.]+)%", line))]
        if not found:
            sys.exit(f"{strategy}: no test result")
        last, accuracy = found[-1]
        return last - begin, last - start, accuracy


EVALUATE = """
import glob, os, sys
import numpy as np
from horovod_hetero.keras import keras_module
from horovod_hetero_lab.data import fashion_mnist
keras = keras_module()
last = max(glob.glob("checkpoint-*.h5"), key=lambda p: int(p.split("-")[1].split(".")[0]))
model = keras.models.load_model(last, compile=False)
_, _, x, y = fashion_mnist()
p = model.predict((x[..., None] / 255.0).astype("float32"), batch_size=500, verbose=0)
print(last, 100.0 * float(np.mean(np.argmax(np.asarray(p), axis=1) == y)))
"""


def run_keras(strategy, stack, args):
    """(rank 0's training seconds, the job's seconds, the test accuracy of rank 0's last checkpoint in %)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "tensorflow2_keras_mnist.py")
        with open(script, "w") as out:
            out.write(keras_script(original("tensorflow2_keras_mnist.py"), strategy, stack, args.keras_epochs))
        start = time.monotonic()
        lines, end = launch(script, args, d, KERAS_STACKS[stack])
        begin = first(lines, "Epoch 1/")
        trained = max(at for at, line in lines if line.startswith("[0]<stdout>:") and " loss: " in line)
        env = dict(os.environ, PYTHONPATH=python_path(), **KERAS_STACKS[stack])
        evaluated = subprocess.run([sys.executable, "-c", EVALUATE], cwd=d, env=env, capture_output=True, text=True)
        if evaluated.returncode != 0:
            sys.exit(f"{strategy} [{stack}]: the evaluation failed:\n{evaluated.stderr[-3000:]}")
        checkpoint, accuracy = evaluated.stdout.split()[-2:]
        if checkpoint != f"checkpoint-{args.keras_epochs}.h5":
            sys.exit(f"{strategy} [{stack}]: the last checkpoint is {checkpoint}")
        return trained - begin, end - start, float(accuracy)


def compare(title, run, args, skip=()):
    """Synchronous then each strategy (but those of ``skip``), ``args.repeats`` times; print each run and the
    medians."""
    ratios: dict[str, list[float]] = {}
    accuracy: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        base, job, acc = run("sync")
        accuracy.setdefault("sync", []).append(acc)
        print(f"[{rep}] {title} Synchronous: {base:.1f} s training ({job:.1f} s job), test accuracy {acc:.2f}%",
              flush=True)
        for name in args.strategies.split(","):
            if name in skip:
                continue
            t, job, acc = run(name)
            ratios.setdefault(name, []).append(t / base)
            accuracy.setdefault(name, []).append(acc)
            print(f"[{rep}] {title} {name}: {t:.1f} s training ({job:.1f} s job), {t / base:.2f}x Synchronous's "
                  f"time, test accuracy {acc:.2f}%", flush=True)
    return ratios, accuracy


def summary(title, ratios, accuracy, repeats):
    lines = [f"{title}; medians of {repeats}:", f"  sync: test accuracy {statistics.median(accuracy['sync']):.2f}%"]
    for name, r in ratios.items():
        lines.append(f"  {name}: {statistics.median(r):.2f}x Synchronous's time (range {min(r):.2f}-{max(r):.2f}), "
                     f"test accuracy {statistics.median(accuracy[name]):.2f}%")
    fixed = {name: statistics.median(r) for name, r in ratios.items() if name != "auto"}
    if "auto" in ratios and fixed:                 # Auto's time over the fastest fixed strategy's, per repeat
        best = min(fixed, key=lambda n: fixed[n])
        over = [a / b for a, b in zip(ratios["auto"], ratios[best])]
        lines.append(f"  auto: {statistics.median(over):.2f}x the time of the fastest fixed strategy ({best}), "
                     f"range {min(over):.2f}-{max(over):.2f}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default="pytorch,keras")
    p.add_argument("--strategies", default="esync,elasticbsp,auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10, help="PyTorch's epochs")
    p.add_argument("--keras-epochs", type=int, default=4)
    p.add_argument("--keras-stacks", default="tensorflow,torch,keras2",
                   help="the first with --repeats, the others beside it with --side-repeats")
    p.add_argument("--side-repeats", type=int, default=1)
    p.add_argument("--train-samples", type=int, default=12000, help="the first N of Fashion-MNIST's 60,000")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--slowdown", default="1,1,1,4")
    p.add_argument("--base-step", type=float, default=0.05)
    p.add_argument("--keras-base-step", type=float, default=0.1)
    args = p.parse_args(argv)
    for name in args.strategies.split(","):
        if name not in TORCH_STRATEGIES:
            p.error(f"--strategies: {name!r} is not one of {', '.join(TORCH_STRATEGIES)}")
    results = []
    if "pytorch" in args.examples.split(","):
        title = (f"Horovod's pytorch_mnist.py, {args.epochs} epochs of {args.train_samples} Fashion-MNIST images, "
                 f"{args.np} workers, slowdown {args.slowdown} ({args.base_step} s steps)")
        results.append((title, *compare("pytorch", lambda s: run_torch(s, args), args), args.repeats))
    if "keras" in args.examples.split(","):
        keras_args = argparse.Namespace(**{**vars(args), "base_step": args.keras_base_step})
        for i, stack in enumerate(args.keras_stacks.split(",")):
            keras_args.repeats = args.repeats if i == 0 else args.side_repeats
            title = (f"Horovod's tensorflow2_keras_mnist.py [{stack}], {args.keras_epochs} epochs of 200 // "
                     f"{args.np} batches of 32, {args.np} workers, slowdown {args.slowdown} "
                     f"({args.keras_base_step} s steps)")
            # Keras 2's model is compiled with Horovod's optimizer, whose average Auto cannot switch
            skip = ("auto",) if stack == "keras2" else ()
            results.append((title, *compare(f"keras [{stack}]", lambda s: run_keras(s, stack, keras_args),
                                            keras_args, skip), keras_args.repeats))
    for result in results:
        print(summary(*result))


if __name__ == "__main__":
    main()
