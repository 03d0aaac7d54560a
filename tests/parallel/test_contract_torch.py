"""The checklist's proof, torch: a strategy defined only in the tests trains under horovodrun."""
import numpy as np
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
from contract_strategy import SpeedProportional
from horovod_hetero.runtime.straggler import Slowdown

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def run(rounds, slowdown="1,1,1,4"):
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=SpeedProportional(), slowdown=Slowdown(RANK, slowdown, base_step_s=0.02))
    after = []
    while len(after) < rounds:
        p.grad = torch.full_like(p, -(RANK + 1.0))
        opt.step()
        if opt.telemetry.records[-1]["synced"]:
            after.append(p.tolist())
    opt.sync_model()
    stats = [r["ranks"] for r in opt.telemetry.records if r["synced"]]
    return opt.strategy.plans, after, stats, p.tolist()


def test_every_rank_plans_the_same_from_the_rounds_statistics_and_fast_ranks_step_more():
    everyone = hvd.allgather_object(run(rounds=6), name="contract.torch")
    plans, afters, stats, finals = zip(*everyone)
    assert all(p == plans[0] for p in plans) and len(plans[0]) == 6    # sync_model's round measured no step
    assert all(a == afters[0] for a in afters)                                 # bit-identical every round
    assert all(s == stats[0] for s in stats)                                   # the same speeds everywhere
    assert all(f == finals[0] for f in finals)
    steady = plans[0][1:6]
    assert all(plan[3] == 1 and min(plan[:3]) >= 2 for plan in steady), plans[0]
    assert [s["local_steps"] for s in stats[0][1:6]] == [list(p) for p in plans[0][:5]]   # each plan was run


def test_ranks_that_stop_early_end_identical_without_a_hang():
    p = torch.nn.Parameter(torch.full((2,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=SpeedProportional(cap=3), slowdown=[1.0] * SIZE)
    for _ in range(4 + 5 * RANK):                                              # 4, 9, 14, 19 steps
        p.grad = torch.full_like(p, float(RANK))
        opt.step()
    opt.sync_model()
    finals = hvd.allgather_object(p.tolist(), name="contract.torch.uneven")
    assert all(f == finals[0] for f in finals) and np.isfinite(finals[0]).all()
