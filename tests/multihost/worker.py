"""One rank of the multi-host test (``tests/multihost/test_multihost.py`` starts it under horovodrun).

``train OUT STRATEGY...``: trains a small torch model with each strategy in turn (same data and
seed for each), then writes ``OUT/<strategy>.rank<r>.npz``: the final parameters after
``sync_model()``, the steps taken, and the address this rank's servers bind (``server_host``).
``cut OUT STRATEGY``: trains until it fails, reporting its step and process id in ``OUT/progress.rank<r>`` so
that the test can cut the link mid-training; the last error line goes to ``OUT/exit.rank<r>.json``
with the time (a SIGTERM, e.g. from horovodrun after another rank failed, is recorded as such).
"""
import json
import os
import signal
import sys
import time
import traceback

import numpy as np
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.transports.addresses import server_host

STEPS = 24
#: The strategies by name (``cases.NAMES``; ``cases.DETERMINISTIC`` are compared bit for bit with one host).
STRATEGIES = {
    "sync": lambda: hh.Synchronous(),
    "localsgd": lambda: hh.LocalSGD(period=4),
    "wagma_groups": lambda: hh.WAGMA(group_size=2, sync_period=4, wait_avoiding=False),
    "wagma": lambda: hh.WAGMA(group_size=2, sync_period=4),
    "esync": lambda: hh.ESync(timeout=2.0),
    "elasticbsp": lambda: hh.ElasticBSP(lookahead=4),
    "dssp": lambda: hh.DSSP(staleness=(2, 6)),
    "adsp": lambda: hh.ADSP(check_period="4steps", search_every="8steps"),
}


def model_and_data(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(STEPS)]
    return model, batches


def step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if hasattr(opt, "report_loss"):
        opt.report_loss(loss.item())
    opt.step()
    return loss.item()


def data_loss(model, batches):
    """Mean loss of ``model`` over ``batches`` (no step)."""
    with torch.no_grad():
        return float(np.mean([torch.nn.functional.cross_entropy(model(x), y).item() for x, y in batches]))


def train(out, names):
    rank = hvd.rank()
    host = server_host(hvd.local_size() == hvd.size())
    for name in names:
        model, batches = model_and_data(rank)
        before = data_loss(model, batches)
        opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), strategy=STRATEGIES[name]())
        losses = [step(model, opt, x, y) for x, y in batches]
        opt.sync_model()
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.savez(os.path.join(out, f"{name}.rank{rank}.npz"), params=params, losses=np.array(losses),
                 data_loss=np.array([before, data_loss(model, batches)]), host=host, local_size=hvd.local_size())
        print(f"rank {rank} {name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def cut(out, name):
    rank = hvd.rank()
    record = os.path.join(out, f"exit.rank{rank}.json")

    def write(error):
        with open(record, "w") as f:
            json.dump({"rank": rank, "error": error, "time": time.time()}, f)

    def on_sigterm(signum, frame):
        write("SIGTERM (from the launcher)")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    model, batches = model_and_data(rank)
    timeout = float(os.environ.get("HH_MULTIHOST_TIMEOUT", "300"))     # the strategy's collective timeout
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), timeout=timeout,
                                  named_parameters=model.named_parameters(), strategy=STRATEGIES[name]())
    try:
        for i in range(10 ** 9):
            x, y = batches[i % len(batches)]
            step(model, opt, x, y)
            with open(os.path.join(out, f"progress.rank{rank}"), "w") as f:
                f.write(f"{i + 1} {os.getpid()}")
            time.sleep(0.01)
    except BaseException as e:
        lines = [line for line in traceback.format_exception_only(type(e), e)[-1].splitlines() if line.strip()]
        write(lines[0] if lines else type(e).__name__)   # the class and message, not the troubleshooting line
        raise


def main():
    mode, out, *names = sys.argv[1:]
    hvd.init(process_sets=hh.wagma_process_sets(group_size=2))
    if mode == "train":
        train(out, names)
    else:
        cut(out, names[0])


if __name__ == "__main__":
    main()
