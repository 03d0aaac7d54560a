"""Train an MLP on scikit-learn's digits with horovod-hetero (Keras 3 with TensorFlow or PyTorch, or Keras 2).

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy localsgd --period 8
    KERAS_BACKEND=torch horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy esync
    TF_USE_LEGACY_KERAS=1 horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy wagma

The model is compiled with a plain local optimizer (``--strategy sync``: ``hh.DistributedOptimizer``,
gradients averaged every step); a callback averages it as the strategy decides and leaves identical
weights on every rank at the end, whatever batch each rank stopped at (``--time-budget``).
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod_hetero.keras as hh  # noqa: E402
from horovod_hetero.data import digits  # noqa: E402
from horovod_hetero.examples import add_strategy_arguments, build_strategy  # noqa: E402

keras = hh.keras_module()
if keras.backend.backend() == "torch":
    import horovod.torch as hvd  # noqa: E402
else:
    import horovod.tensorflow as hvd  # noqa: E402


class TimeBudget(keras.callbacks.Callback):
    """Stop training after ``seconds``; count the samples trained and the training time."""

    def __init__(self, seconds, batch_size, n):
        super().__init__()
        self.seconds, self.batch_size, self.n, self.samples = seconds, batch_size, n, 0

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.samples += min(self.batch_size, self.n - batch * self.batch_size)    # the last batch is partial
        if self.seconds is not None and time.perf_counter() - self.start >= self.seconds:
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)
    p.add_argument("--epochs", type=int, default=30, help="(with --time-budget: at most)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="stop after this many seconds (model-averaging strategies: ranks may stop at any batch)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    args = p.parse_args()
    if args.strategy == "sync" and args.time_budget is not None:
        p.error("--time-budget needs a model-averaging strategy: synchronous ranks must run the same batches")

    if args.strategy == "wagma":         # WAGMA's group process sets are registered at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    else:
        hvd.init()
    one_thread()
    keras.utils.set_random_seed(hvd.rank())
    x, y, x_test, y_test = digits(hvd.rank(), hvd.size())
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(args.lr, momentum=0.9)
    budget = TimeBudget(args.time_budget, args.batch_size, len(y))
    callbacks = [hh.callbacks.BroadcastGlobalVariablesCallback(0), budget]
    if args.strategy == "sync":
        optimizer = hh.DistributedOptimizer(optimizer)
    else:
        # ranks stop on their own clock (--time-budget), at any batch: rounds run on across epochs
        callbacks.append(hh.callbacks.HeteroSyncCallback(build_strategy(args), batch_size=args.batch_size,
                                                         epoch_sync=False))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 and args.time_budget is None else 0)
    wall = budget.wall                   # fit's training, after its build and tracing, to its last sync
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    samples = sum(hvd.allgather_object(budget.samples, name="samples"))
    if hvd.rank() == 0:
        result = {"strategy": args.strategy, "keras": f"{keras.__version__} ({keras.backend.backend()})",
                  "accuracy": float(accuracy), "samples": samples, "wall_s": wall, "samples_per_s": samples / wall}
        print(json.dumps(result), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
