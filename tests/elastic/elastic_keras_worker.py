"""Horovod's elastic Keras recipe (``hvd.elastic.KerasState``, its commit and epoch callbacks,
``hvd.elastic.run`` around ``fit``) with a strategy callback added; run by ``test_elastic_keras.py``.

Rank 0 grows the job from 2 to 4 workers, then shrinks it back to 2; every process appends what it
saw to a JSON-lines log. Keras 2 (``TF_USE_LEGACY_KERAS=1``): Horovod 0.28's ``KerasState`` calls
``optimizer.variables()``, a list on Keras 3."""
import argparse
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
import horovod_hetero.keras as hh
from elastic_job import log, set_hosts

STRATEGIES = {"localsgd": lambda: hh.callbacks.LocalSGDCallback(period=3), "esync": hh.callbacks.ESyncCallback,
              "wagma": lambda: hh.callbacks.WAGMACallback(group_size=2, sync_period=4),
              "elasticbsp": hh.callbacks.ElasticBSPCallback, "dssp": hh.callbacks.DSSPCallback}


def main():
    parser = argparse.ArgumentParser()       # horovodrun reads options after the command too: only a positional
    parser.add_argument("strategy", choices=STRATEGIES)
    args = parser.parse_args()
    hvd.init(process_sets="dynamic")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    # Horovod's KerasState broadcasts the optimizer's variables: a new worker's must exist too
    # (else old and new workers broadcast different lists, and the state's sync deadlocks)
    model.optimizer.build(model.trainable_variables)
    strategy = STRATEGIES[args.strategy]()
    state = hvd.elastic.KerasState(model, epoch=0)
    sizes = []

    class Resize(tf.keras.callbacks.Callback):
        """Rank 0 asks for 4 workers after the first epoch, for 2 again after two epochs with 4;
        every survivor stops two epochs after the job shrank back (the same test on every rank)."""

        def on_train_begin(self, logs=None):
            self.epochs_here = 0

        def on_epoch_end(self, epoch, logs=None):
            rank, size = hvd.rank(), hvd.size()
            self.epochs_here += 1
            plan = strategy.strategy.plan
            log(event="epoch", rank=rank, size=size, plan=None if plan is None else list(plan.steps))
            if rank == 0 and sizes == [2]:
                set_hosts("localhost:2\n127.0.0.1:2\n")
            if rank == 0 and size == 4 and self.epochs_here >= 2:
                set_hosts("localhost:2\n")
            if 4 in sizes and size == 2 and self.epochs_here >= 2:
                self.model.stop_training = True
            time.sleep(0.3)                  # the discovery script is read every second

    x = np.linspace(-1, 1, 8 * 4 * 6, dtype="float32").reshape(-1, 4) * (hvd.rank() + 1)
    y = x.sum(1, keepdims=True) * 0.5
    callbacks = [strategy,                                                 # syncs first at an epoch's end,
                 hvd.elastic.UpdateEpochStateCallback(state),              # then Horovod's callbacks commit
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10 ** 9), Resize()]

    @hvd.elastic.run
    def train(state):
        sizes.append(hvd.size())
        log(event="start", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch)
        model.fit(x, y, batch_size=8, epochs=60 - state.epoch, shuffle=False, verbose=0,   # as Horovod's example
                  callbacks=callbacks)
        return hvd.rank(), hvd.size()

    rank, size = train(state)
    log(event="end", rank=rank, size=size, epoch=state.epoch, sizes=sizes, step=strategy.strategy.step,
        params=[w.tolist() for w in model.get_weights()])


if __name__ == "__main__":
    main()
