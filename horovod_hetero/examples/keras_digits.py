"""Train an MLP on scikit-learn's digits with horovod-hetero (Keras).

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy localsgd --period 8
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy wagma --period 8

The model is compiled with a plain local optimizer; ``LocalSGDCallback`` averages it every
``period`` batches (counted across epochs) and leaves identical weights on every rank at the end.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402
import horovod_hetero.tensorflow.keras as hh  # noqa: E402
from horovod_hetero.data import digits  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=["sync", "localsgd", "wagma"], default="localsgd")
    p.add_argument("--period", type=int, default=8, help="LocalSGD period, WAGMA sync_period")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--result", default=None)
    args = p.parse_args()

    if args.strategy == "wagma":         # WAGMA's group process sets are registered at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=None))
    else:
        hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(hvd.rank())
    x, y, x_test, y_test = digits(hvd.rank(), hvd.size())
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if args.strategy == "sync":
        optimizer = hvd.DistributedOptimizer(optimizer)
    elif args.strategy == "wagma":
        callbacks.append(hh.callbacks.WAGMACallback(sync_period=args.period, batch_size=args.batch_size))
    else:
        callbacks.append(hh.callbacks.LocalSGDCallback(period=args.period, batch_size=args.batch_size))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        result = {"strategy": args.strategy, "accuracy": accuracy}
        print(json.dumps(result), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
