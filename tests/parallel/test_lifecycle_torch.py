"""What a strategy opens, the library closes: nothing outlives sync_model() (torch)."""
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from lifecycle import opened, settled

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (WAGMA S=2)")


def train(opt, p, steps):
    for _ in range(steps):
        p.grad = torch.full_like(p, -(RANK + 1.0))
        opt.step()


def wrapped(strategy):
    p = torch.nn.Parameter(torch.zeros(4))
    return hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], strategy=strategy), p


def test_esync_and_wagma_leave_no_thread_or_socket_behind_and_reopen_after_sync_model():
    opt, p = wrapped(hh.LocalSGD(2))                  # framework threads start lazily: warm them up
    train(opt, p, 4)
    opt.sync_model()
    hvd.allreduce(torch.zeros(1), name="lifecycle.barrier.0")
    before = settled(opened())
    seen = {}
    for name, strategy in [("esync", hh.ESync()), ("wagma", hh.WAGMA(group_size=2, sync_period=3))]:
        opt, p = wrapped(strategy)
        train(opt, p, 6)
        seen[name] = opened()                         # while training
        opt.sync_model()
        seen[name + " closed"] = settled(before)
        train(opt, p, 6)                              # a step after sync_model opens them again
        seen[name + " reopened"] = opened()
        opt.sync_model()
        seen[name + " closed again"] = settled(before)
        hvd.allreduce(torch.zeros(1), name=f"lifecycle.barrier.{name}")
    for name in ("esync", "wagma"):
        for phase in (" closed", " closed again"):
            assert seen[name + phase] == before, (name + phase, seen[name + phase], before)
    # it could fail: training did open something (the state server on rank 0, a responder everywhere)
    if RANK == 0:
        assert len(seen["esync"]["listening"]) > len(before["listening"])
        assert len(seen["esync reopened"]["listening"]) > len(before["listening"])
    assert "horovod_hetero-group-responder" in seen["wagma"]["threads"]
    assert "horovod_hetero-group-responder" in seen["wagma reopened"]["threads"]
