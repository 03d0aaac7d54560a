"""Horovod's elastic Keras recipe (``hvd.elastic.KerasState``, its commit and epoch callbacks,
``hvd.elastic.run`` around ``fit``) on two hosts (``localhost:2``, ``127.0.0.1:2``) with a strategy
callback added, or Synchronous (``hh.DistributedOptimizer``, as Horovod's own optimizer on Keras 2);
run by ``test_elastic_kill.py``. The worker of rank ``victim`` kills itself with SIGKILL in the middle
of the second epoch; the other host's two workers go on from the last commit. Keras 2
(``TF_USE_LEGACY_KERAS=1``), as ``elastic_keras_worker.py``."""
import argparse
import os
import signal
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
import horovod_hetero.keras as hh
from elastic_job import log, start_together
from elastic_keras_worker import STRATEGIES

EPOCHS = 4


def main():
    parser = argparse.ArgumentParser()       # horovodrun reads options after the command too: positionals only
    parser.add_argument("strategy", choices=[*STRATEGIES, "sync"])
    parser.add_argument("victim", type=int)
    args = parser.parse_args()
    start_together(4)                         # the frameworks imported: hvd.init within its timeout
    hvd.init(process_sets="dynamic")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    sync = args.strategy == "sync"
    optimizer = tf.keras.optimizers.SGD(0.05)
    model.compile(optimizer=hh.DistributedOptimizer(optimizer) if sync else optimizer, loss="mse")
    model.optimizer.build(model.trainable_variables)        # KerasState broadcasts them (elastic_keras_worker.py)
    strategy = hh.callbacks.BroadcastGlobalVariablesCallback(0) if sync else STRATEGIES[args.strategy]()
    state = hvd.elastic.KerasState(model, epoch=0)
    state.register_reset_callbacks([lambda: log(event="reset", rank=hvd.rank(), size=hvd.size(), t=time.time())])

    class Kill(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if hvd.size() == 4 and hvd.rank() == args.victim and state.epoch == 1 and batch == 4:
                log(event="kill", rank=hvd.rank(), t=time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.02 * (1 + hvd.rank() % 2))                        # odd ranks step slower

        def on_epoch_end(self, epoch, logs=None):
            log(event="epoch", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch)   # (updated by then)

    x = np.linspace(-1, 1, 8 * 4 * 8, dtype="float32").reshape(-1, 4) * (hvd.rank() + 1)
    y = x.sum(1, keepdims=True) * 0.5
    callbacks = [strategy, hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10 ** 9), Kill()]

    @hvd.elastic.run
    def train(state):
        log(event="start", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, t=time.time())
        model.fit(x, y, batch_size=8, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0,  # as Horovod's example
                  callbacks=callbacks)
        return hvd.rank(), hvd.size()

    rank, size = train(state)
    log(event="end", rank=rank, size=size, epoch=state.epoch, params=[w.tolist() for w in model.get_weights()])


if __name__ == "__main__":
    main()
