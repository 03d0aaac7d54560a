"""A Horovod elastic training script (``hvd.elastic.run``, ``TorchState``), its strategy changed by
one line; run by ``test_elastic_torch.py`` under ``horovodrun --host-discovery-script``.

Rank 0 grows the job from 2 to 4 workers (it rewrites the hosts the discovery script prints),
then shrinks it back to 2; every process appends what it saw to a JSON-lines log."""
import argparse
import faulthandler
import signal
import sys
import time

import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
from elastic_job import log, set_hosts

STRATEGIES = {"sync": hh.Synchronous, "localsgd": lambda: hh.LocalSGD(period=3), "esync": hh.ESync,
              "wagma": lambda: hh.WAGMA(group_size=2, sync_period=4), "elasticbsp": hh.ElasticBSP,
              "dssp": hh.DSSP, "balanced": lambda: hh.Balanced(rebalance_every=2),
              "adsp": lambda: hh.ADSP(check_period="4steps", search_every="8steps"),
              "switch": hh.Synchronous,
              "auto": lambda: hh.Auto(candidates=["sync", "esync", "elasticbsp"], trial_rounds=0)}
#: ``switch``: the strategy set_strategy() runs from the end of each of these epochs on (state.epoch after it), of
#: either kind, across the job's growth (at the end of epoch 1) and its shrinking back
SWITCHES = {1: lambda: hh.ESync(), 2: lambda: hh.Balanced(rebalance_every=2), 4: lambda: hh.ElasticBSP()}


def build(name):
    """``hvd.init`` (dynamic process sets: WAGMA adds its groups for each size), then the model, the
    strategy called ``name``, its sampler (Balanced draws its batches from the batch sampler, which
    splits among Horovod's current ranks; else None) and the wrapped optimizer."""
    hvd.init(process_sets="dynamic")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    strategy = STRATEGIES[name]()
    batches = name in ("balanced", "switch")              # Balanced (now or later) draws from the batch sampler
    sampler = hh.DistributedSampler(range(10_000), batch_size=8) if batches else None
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(), strategy=strategy, sampler=sampler)
    return model, strategy, sampler, opt


#: how many times an even rank's step an odd rank's takes: 2, and 4 for ``auto``, whose straggler must read as
#: persistent (at least 1.5x the fastest, ``advise.SLOW_RATIO``) on a loaded machine too, where the compute
#: that every step adds to its sleep brought 2x down to 1.4-1.6x
SLOWER = {"auto": 4}


def train_step(model, opt, rank, batches=None, slower=2):
    """One step on this rank's data (a batch of ``batches``' size, else 8); odd ranks ``slower`` times slower."""
    n = len(next(batches)) if batches is not None else 8
    x = torch.full((n, 4), float(rank + 1)) * torch.linspace(-1, 1, n)[:, None]
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True) * 0.5).backward()
    opt.step()
    time.sleep(0.02 * (slower if rank % 2 else 1))


def main():
    parser = argparse.ArgumentParser()       # horovodrun reads options after the command too: only a positional
    parser.add_argument("strategy", choices=STRATEGIES)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)    # where a worker waits, on demand
    model, strategy, sampler, opt = build(args.strategy)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, grown=-1, shrunk=-1)
    sizes = []

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        sizes.append(size)
        log(event="start", rank=rank, size=size, epoch=state.epoch)
        deadline, epochs_here = time.monotonic() + 120, 0
        # done two epochs after the job shrank back to 2 (every survivor saw 2, 4, 2: the same test everywhere;
        # a reset that only removed workers skips the state's sync, so rank 0's fields may not have arrived)
        while not (4 in sizes and size == 2 and epochs_here >= 2):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no resize seen: epoch {state.epoch}, size {size}")
            batches = iter(sampler) if sampler is not None else None
            for _ in range(6):
                train_step(model, opt, rank, batches, SLOWER.get(args.strategy, 2))
            # the epoch ends as in Horovod's elastic examples, with the strategy's sync first: every
            # rank in the same round, so commit's own collective (it checks for new hosts) meets no round
            opt.sync_model()
            state.epoch += 1
            epochs_here += 1
            plan = opt.strategy.plan
            if opt.runner.plans_batches:                      # the batch sizes for the current ranks
                plan = list(opt.runner.batch_sizes(opt.strategy.step + 1, size))
            log(event="epoch", rank=rank, size=size, plan=None if plan is None else list(getattr(plan, "steps", plan)),
                strategy=type(opt.strategy).__name__, epoch=state.epoch, step=opt.strategy.step,
                running=getattr(opt.strategy, "current_name", None))
            if args.strategy == "switch" and state.epoch in SWITCHES:
                opt.set_strategy(SWITCHES[state.epoch]())
            if rank == 0 and size == 2 and state.grown < 0:
                state.grown = state.epoch
                set_hosts("localhost:2\n127.0.0.1:2\n")                     # grow to 4
            if rank == 0 and size == 4 and state.shrunk < 0 and state.epoch >= state.grown + 2:
                state.shrunk = state.epoch
                set_hosts("localhost:2\n")                                  # shrink back to 2
            state.commit()
        return rank, size

    rank, size = train(state)
    log(event="end", rank=rank, size=size, epoch=state.epoch, sizes=sizes, step=opt.strategy.step,
        strategy=type(opt.strategy).__name__, params=[p.tolist() for p in model.parameters()])


if __name__ == "__main__":
    main()
