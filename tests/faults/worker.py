"""One rank of a fault-injection job (run by tests/faults/harness.py under horovodrun, never by pytest).

    python worker.py STRATEGY FRAMEWORK STEPS

Trains a small model on synthetic data, each step padded with a short sleep so that four ranks
share two cores. Prints ``PID <pid>`` first, ``PROGRESS <step> <unix time>`` every 5 steps and,
after ``sync_model()``, ``RESULT <checksum of the model>``. On an exception it prints
``ERROR <class name> <unix time>`` and raises it again (the traceback is the user's view).
Strategy timeouts come from ``FAULTS_TIMEOUT`` (seconds), the ESync query timeout from
``FAULTS_QUERY_TIMEOUT``; with ``FAULTS_UNTIL`` (a path; torch) a rank trains on past ``STEPS`` until
that file exists. Rank 0 prints ESync's state server address (``STATE <address>``) and
every rank's WAGMA activation address (``ACTIVATIONS <address>...``) for the intruder.
"""
import os
import sys
import time

STRATEGY, FRAMEWORK, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
TIMEOUT = float(os.environ.get("FAULTS_TIMEOUT", "10"))
QUERY_TIMEOUT = float(os.environ.get("FAULTS_QUERY_TIMEOUT", "2"))
BATCH, PAD_S = 16, 0.01


def say(*words):
    """One marker line, written whole (one write, so no C++ log line of another thread lands inside it)."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def strategy(hh):
    return {"sync": lambda: hh.Synchronous(),
            "localsgd": lambda: hh.LocalSGD(4),
            "esync": lambda: hh.ESync(timeout=QUERY_TIMEOUT),
            "wagma": lambda: hh.WAGMA(group_size=2, sync_period=4, timeout=TIMEOUT),
            "elasticbsp": lambda: hh.ElasticBSP(lookahead=4),
            "dssp": lambda: hh.DSSP(staleness=(1, 4)),
            "adsp": lambda: hh.ADSP(check_period=4, search_every=None)}[STRATEGY]()


def torch_main():
    import torch
    import horovod.torch as hvd
    import horovod_hetero.torch as hh

    sets = STRATEGY == "wagma" or os.environ.get("FAULTS_PROCESS_SETS")
    hvd.init(process_sets=hh.wagma_process_sets(group_size=2) if sets else None)
    rank = hvd.rank()
    say("PID", os.getpid())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
                                  strategy=strategy(hh), timeout=TIMEOUT)
    generator = torch.Generator().manual_seed(rank)
    until = os.environ.get("FAULTS_UNTIL")           # train on until the harness creates this file
    step = 0
    while step < STEPS or (until and not os.path.exists(until)):
        step += 1
        x = torch.randn(BATCH, 32, generator=generator)
        y = torch.randint(0, 10, (BATCH,), generator=generator)
        time.sleep(PAD_S)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.report_loss(loss)
        opt.step()
        if step == 1:
            report_addresses(opt._hh)
        if step % 5 == 0:
            say("PROGRESS", step, f"{time.time():.3f}")
    opt.sync_model()
    say("RESULT", f"{sum(float(p.double().sum()) for p in model.parameters()):.12e}")


def keras_main():
    import numpy as np
    import keras
    import horovod.tensorflow as hvd
    import horovod_hetero.keras as hh

    hvd.init()
    rank = hvd.rank()
    say("PID", os.getpid())
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((STEPS * BATCH, 32)).astype("float32")
    y = rng.integers(0, 10, STEPS * BATCH)

    class Progress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(PAD_S)
            if (batch + 1) % 5 == 0:
                say("PROGRESS", batch + 1, f"{time.time():.3f}")

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if STRATEGY == "sync":
        model.compile(optimizer=hh.DistributedOptimizer(keras.optimizers.SGD(0.05), timeout=TIMEOUT), loss=loss)
        callbacks = [hh.callbacks.BroadcastGlobalVariablesCallback(0)]          # as every Horovod Keras script
    else:
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss)
        callbacks = [hh.callbacks.HeteroSyncCallback(strategy=strategy(hh), timeout=TIMEOUT)]
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks + [Progress()])
    say("RESULT", f"{sum(float(np.asarray(w, dtype=np.float64).sum()) for w in model.get_weights()):.12e}")


def report_addresses(controller):
    """The addresses of this rank's servers (the intruder's targets), from the open transports."""
    transports = controller.transports
    if transports is None or controller.rank != 0:
        return
    if transports.server is not None:
        say("STATE", transports.server.address)
    activations = getattr(transports.groups, "_activations", None)
    if activations is not None:
        say("ACTIVATIONS", *activations.addresses)


if __name__ == "__main__":
    try:
        torch_main() if FRAMEWORK == "torch" else keras_main()
    except BaseException as e:
        say("ERROR", type(e).__name__, f"{time.time():.3f}")
        raise
