"""Train a bench task with horovod-hetero (Keras 3 with TensorFlow or PyTorch, or Keras 2): an MLP on scikit-learn's
digits (the default), a CNN on Fashion-MNIST (``--task fashion-cnn``, ``--split``).

The bench's training script: needs horovod-hetero's lab beside the library (datasets, options, results):
from a checkout, ``pip install -e lab`` (``make`` does it).

    horovodrun -np 4 -H localhost:4 --gloo python examples/keras_digits.py --strategy localsgd --period 8
    KERAS_BACKEND=torch horovodrun -np 4 -H localhost:4 --gloo python examples/keras_digits.py --strategy esync
    TF_USE_LEGACY_KERAS=1 horovodrun -np 4 -H localhost:4 --gloo python examples/keras_digits.py --strategy wagma

The model is compiled with a plain local optimizer (``--strategy sync``: ``hh.DistributedOptimizer``,
gradients averaged every step); a callback averages it as the strategy decides and leaves identical
weights on every rank at the end, whatever batch each rank stopped at (``--time-budget``; with
``--strategy sync`` rank 0 decides when the budget is spent and every rank stops at that batch).
"""
import argparse
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod_hetero.keras as hh  # noqa: E402
from horovod_hetero_lab.data import TASKS, class_accuracy, score, task_data  # noqa: E402
from horovod_hetero_lab.harness import (  # noqa: E402
    Curve, add_run_arguments, add_strategy_arguments, aggregation, build_strategy, curve_subset, write_result)

keras: Any = hh.keras_module()
if keras.backend.backend() == "torch":
    import horovod.torch as hvd  # noqa: E402
else:
    import horovod.tensorflow as hvd  # noqa: E402


class TimeBudget(keras.callbacks.Callback):
    """Stop training after ``seconds``; count the samples trained and the training time. ``together``:
    rank 0 decides and every rank stops at the same batch (ranks that average gradients every step
    must run the same batches); the start is after a common barrier. ``curve`` gets every step, with
    ``synced()`` telling whether the model was just averaged over every rank."""

    def __init__(self, seconds, batch_size, n, together, curve, synced):
        super().__init__()
        self.seconds, self.batch_size, self.n, self.samples, self.steps = seconds, batch_size, n, 0, 0
        self.together, self.curve, self.synced = together, curve, synced

    def on_train_begin(self, logs=None):
        hvd.allgather_object(None, name="horovod_hetero.example.start")   # a barrier (TF's Horovod has no hvd.barrier)
        self.start = time.perf_counter()
        self.curve.begin()

    def on_train_batch_end(self, batch, logs=None):
        self.samples += min(self.batch_size, self.n - batch * self.batch_size)    # the last batch is partial
        self.steps += 1
        self.curve.after_step(self.steps, self.synced())
        if self.seconds is None:
            return
        stop = time.perf_counter() - self.start >= self.seconds
        if self.together:
            stop = hvd.broadcast_object(stop, root_rank=0, name="horovod_hetero.example.stop")
        if stop:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.wall = time.perf_counter() - self.start


def one_thread():
    """One compute thread per rank (ranks share the cores), as the torch example."""
    if keras.backend.backend() == "torch":
        import torch
        torch.set_num_threads(1)
    else:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def build_model(task, shape):
    """The task's model (``Task.model``), as the torch example's; ``shape``: one input's shape."""
    layers = keras.layers
    if task.model == "cnn":
        body = [layers.Reshape((8, 8, 1)), layers.Conv2D(16, 3, padding="same", activation="relu"),
                layers.MaxPooling2D(2), layers.Flatten(), layers.Dense(10)]
    elif task.model == "fashion-cnn":          # channels first, as the data (and the torch model)
        body = [layers.Permute((2, 3, 1)), layers.Conv2D(16, 5, padding="same", activation="relu"),
                layers.MaxPooling2D(2), layers.Conv2D(32, 5, padding="same", activation="relu"),
                layers.MaxPooling2D(2), layers.Flatten(), layers.Dense(32, activation="relu"), layers.Dense(10)]
    elif task.model == "linear":
        body = [layers.Dense(1, use_bias=False)]
    elif task.model == "mlp":
        body = [layers.Dense(128, activation="relu"), layers.Dense(10)]
    else:
        raise SystemExit(f"--task {task.name}: the Keras example trains digits, cnn, synthetic and fashion-cnn; "
                         f"the torch example trains every task")
    return keras.Sequential([keras.Input(shape), *body])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)
    add_run_arguments(p)
    args = p.parse_args()
    task = TASKS[args.task]
    if isinstance(build_strategy(args), hh.GradientWeighting):
        raise SystemExit("--strategy balanced: the Keras example trains one fit() for the whole budget, and Balanced's "
                         "Keras callback plans a batch size per fit() (an epoch): see hh.callbacks.BalancedCallback; "
                         "examples/torch_digits.py runs it")

    if args.strategy in ("wagma", "auto"):   # WAGMA's group process sets (Auto's candidate too), at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    else:
        hvd.init()
    one_thread()
    keras.utils.set_random_seed(args.seed * 1000 + hvd.rank())
    x, y, x_test, y_test = task_data(task, hvd.rank(), hvd.size(), args.seed, args.skew, args.split)
    model = build_model(task, x.shape[1:])
    lr = args.lr or task.lr
    optimizer = keras.optimizers.Adam(lr) if task.optimizer == "adam" else keras.optimizers.SGD(lr, momentum=0.9)
    callbacks = [hh.callbacks.BroadcastGlobalVariablesCallback(0)]
    sync = None
    if args.strategy == "sync":
        optimizer = hh.DistributedOptimizer(optimizer)
        callbacks.append(hh.callbacks.SlowdownCallback(batch_size=args.batch_size))  # HOROVOD_HETERO_*, as the strategies
    else:
        # ranks stop on their own clock (--time-budget), at any batch: rounds run on across epochs
        sync = hh.callbacks.HeteroSyncCallback(build_strategy(args), batch_size=args.batch_size, epoch_sync=False,
                                               aggregate=aggregation(args))
        callbacks.append(sync)

    def evaluate(weights=None, xs=x_test, ys=y_test):
        if weights is not None:
            model.set_weights(weights)
        outputs = model.predict(xs, batch_size=1000, verbose=0)
        out = {task.metric: score(task, outputs, ys)}
        if task.classes:
            out["classes"] = class_accuracy(outputs, ys, task.classes)
        return out

    subset = curve_subset(task, y_test)
    curve = Curve(args.curve if hvd.rank() == 0 else None, args.eval_interval, model.get_weights,
                  lambda weights: evaluate(weights, x_test[subset], y_test[subset]), task.metric)
    budget = TimeBudget(args.time_budget, args.batch_size, len(y), together=sync is None, curve=curve,
                        synced=lambda: sync is None or sync.telemetry.records[-1]["synced"])
    callbacks.append(budget)             # after the strategy's callback: it sees the step's averaging
    loss = (keras.losses.MeanSquaredError() if task.loss == "mse"
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.compile(optimizer=optimizer, loss=loss)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 and args.time_budget is None else 0)
    wall = budget.wall                   # from fit's start barrier (before the first batch traces the
                                         # train function: tracing is inside) to its last batch
    curve.final(budget.steps)
    samples = sum(hvd.allgather_object(budget.samples, name="samples"))
    if hvd.rank() == 0:
        curve.evaluate_all()             # the snapshots, in order; the model ends at its final weights
        final = evaluate()
        result = {"strategy": args.strategy, "task": task.name, "split": args.split or task.split,
                  "keras": f"{keras.__version__} ({keras.backend.backend()})", task.metric: final[task.metric],
                  "steps_rank0": budget.steps, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
                  "eval_s": curve.eval_s}
        write_result(result, task, final, args.result)


if __name__ == "__main__":
    main()
