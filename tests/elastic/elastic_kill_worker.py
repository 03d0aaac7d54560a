"""A Horovod elastic script (``hvd.elastic.run``, ``TorchState``) on two hosts (``localhost:2``,
``127.0.0.1:2``), its strategy changed by one line; run by ``test_elastic_kill.py``. The worker of rank
``victim`` kills itself with SIGKILL in the middle of the second epoch (a preempted node); Horovod
blacklists its host and the job goes on with the other host's two workers from the last commit.
Every process appends what it saw to a JSON-lines log."""
import argparse
import faulthandler
import os
import signal
import sys
import time

import horovod.torch as hvd
from elastic_job import log, start_together
from elastic_worker import STRATEGIES, build, train_step

EPOCHS = 4


def main():
    parser = argparse.ArgumentParser()       # horovodrun reads options after the command too: positionals only
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("victim", type=int)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)    # where a worker waits, on demand
    start_together(4)                         # the frameworks imported: hvd.init within its timeout
    model, strategy, sampler, opt = build(args.strategy)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)
    state.register_reset_callbacks([lambda: log(event="reset", rank=hvd.rank(), size=hvd.size(), t=time.time())])

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        log(event="start", rank=rank, size=size, epoch=state.epoch, t=time.time())
        named = False
        while state.epoch < EPOCHS:
            batches = iter(sampler) if sampler is not None else None
            for i in range(8):
                if size == 4 and rank == args.victim and state.epoch == 1 and i == 4:
                    log(event="kill", rank=rank, t=time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                train_step(model, opt, rank, batches)
                if not named and args.strategy in ("sync", "balanced"):  # Horovod's names of this session's
                    log(event="names", rank=rank, names=sorted(opt._hh_gradients._engine._parameter_names.values()))  # first allreduces
                    named = True
            opt.sync_model()
            state.epoch += 1
            log(event="epoch", rank=rank, size=size, epoch=state.epoch)
            state.commit()
        return rank, size

    def failed(error):
        log(event="failed", error=f"{type(error).__name__}: {error}"[:300], t=time.time())

    def step_logged(closure=None, step=opt.step):    # when this worker saw the failure, and how
        try:
            return step(closure)
        except Exception as e:
            failed(e)
            raise

    def sync_logged(sync=opt.sync_model):
        try:
            return sync()
        except Exception as e:
            failed(e)
            raise

    opt.step, opt.sync_model = step_logged, sync_logged
    try:
        rank, size = train(state)
    except Exception as e:            # the job ends here (WAGMA: a named error, no reset)
        log(event="ended", error=f"{type(e).__name__}: {e}"[:300], t=time.time())
        raise
    log(event="end", rank=rank, size=size, epoch=state.epoch, params=[p.tolist() for p in model.parameters()])


if __name__ == "__main__":
    main()
