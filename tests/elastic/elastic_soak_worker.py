"""A Horovod elastic script (``hvd.elastic.run``, ``TorchState``) on two hosts (``localhost:2``,
``127.0.0.1:2``) whose second host keeps failing; run by ``test_elastic_soak.py``. While four workers
train, the worker of rank 2 kills itself with SIGKILL in the middle of an epoch, ``kills`` times in
all, two epochs after the job last shrank and one after it last grew back; Horovod blacklists the host,
the two survivors go on from the last commit, and once the host's cooldown ends
(``--blacklist-cooldown-range``) the discovery script still lists it: two new workers join and the job
grows back to four. The job ends two epochs after it last grew back (with ``kills`` 0: after ``epochs``
epochs). With ``gap`` (seconds, optional), each kill also waits until four workers have trained that long
since the job last grew back (or started): a failure every ``gap`` seconds and its recovery. Every process
appends what it saw to a JSON-lines log."""
import argparse
import os
import signal
import time

import horovod.torch as hvd
from elastic_job import log
from elastic_worker import STRATEGIES, build, train_step

STEPS = 8
VICTIM = 2


def main():
    parser = argparse.ArgumentParser()       # horovodrun reads options after the command too: positionals only
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("kills", type=int)
    parser.add_argument("epochs", type=int)
    parser.add_argument("gap", type=float, nargs="?", default=0.0)
    args = parser.parse_args()
    model, strategy, sampler, opt = build(args.strategy)
    # kill_at: the epoch in which the next kill comes (moved on by the survivors of each kill)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, kills=0, kill_at=1, grown_at=0,
                                   grown_t=time.time())

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        if size < 4 and state.epoch >= state.kill_at:     # the survivors of a kill (restored: the last commit)
            state.kills, state.kill_at = state.kills + 1, state.epoch + 2
        if size == 4 and state.grown_at < 0:
            state.grown_at, state.grown_t = state.epoch, time.time()
        elif size < 4:
            state.grown_at = -1
        log(event="start", rank=rank, size=size, epoch=state.epoch, kills=state.kills, t=time.time())
        deadline = time.monotonic() + 150 + args.gap
        while not done(state, size):
            if time.monotonic() > deadline:
                raise RuntimeError(f"stuck: epoch {state.epoch}, size {size}, kills {state.kills}")
            batches = iter(sampler) if sampler is not None else None
            for i in range(STEPS):
                if size == 4 and rank == VICTIM and state.kills < args.kills and state.epoch >= state.kill_at \
                        and state.epoch > state.grown_at and i == STEPS // 2 \
                        and time.time() - state.grown_t >= args.gap:
                    log(event="kill", rank=rank, t=time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                train_step(model, opt, rank, batches)
            opt.sync_model()
            state.epoch += 1
            log(event="epoch", rank=rank, size=size, epoch=state.epoch, t=time.time())
            state.commit()
        return rank, size

    def done(state, size):
        if args.kills == 0:
            return state.epoch >= args.epochs
        return state.kills == args.kills and size == 4 and state.grown_at >= 0 and state.epoch >= state.grown_at + 2

    t0 = time.time()
    rank, size = train(state)
    log(event="end", rank=rank, size=size, epoch=state.epoch, kills=state.kills, t0=t0, t=time.time(),
        params=[p.tolist() for p in model.parameters()])


if __name__ == "__main__":
    main()
