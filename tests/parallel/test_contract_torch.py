"""The checklist's proof, torch: a strategy defined only in the tests trains under horovodrun, and
so do the library's planned strategies (ElasticBSP, DSSP), with the same assertions."""
import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from contract_strategy import PLANNED, replan
from horovod_hetero.runtime.straggler import Slowdown

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()


def run(make, rounds, slowdown="1,1,1,4"):
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=make(), slowdown=Slowdown(RANK, slowdown, base_step_s=0.02))
    after = []
    while len(after) < rounds:
        p.grad = torch.full_like(p, -(RANK + 1.0))
        opt.step()
        if opt.telemetry.records[-1]["synced"]:
            after.append(p.tolist())
    opt.sync_model()
    rounds = [r for r in opt.telemetry.records if r["synced"]]
    return [tuple(r["plan"]) for r in rounds], after, [r["ranks"] for r in rounds], p.tolist()


@pytest.mark.parametrize("name", PLANNED)
def test_every_rank_plans_the_same_from_the_rounds_statistics_and_fast_ranks_step_more(name):
    everyone = hvd.allgather_object(run(PLANNED[name], rounds=6), name=f"contract.torch.{name}")
    plans, afters, stats, finals = zip(*everyone)
    assert all(p == plans[0] for p in plans) and len(plans[0]) == 6    # sync_model's round measured no step
    assert all(a == afters[0] for a in afters)                                 # bit-identical every round
    assert all(s == stats[0] for s in stats)                                   # the same speeds everywhere
    assert all(f == finals[0] for f in finals)
    steady = plans[0][1:6]
    assert all(plan[3] == 1 and min(plan[:3]) >= 2 for plan in steady), plans[0]
    # each plan is the strategy's rule applied to the round's statistics (measured times: the rule's
    # exact answer, not a fixed plan, which 20 ms steps on shared cores would make timing-dependent)
    assert list(steady) == [replan(PLANNED[name], s) for s in stats[0][1:6]], (plans[0], stats[0])
    assert [s["local_steps"] for s in stats[0][1:6]] == [list(p) for p in plans[0][:5]]   # each plan was run


@pytest.mark.parametrize("name", PLANNED)
def test_ranks_that_stop_early_end_identical_without_a_hang(name):
    p = torch.nn.Parameter(torch.full((2,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=PLANNED[name](), slowdown=Slowdown(RANK, [1, 1, 2, 3], base_step_s=0.01))
    for _ in range(4 + 5 * RANK):                                              # 4, 9, 14, 19 steps
        p.grad = torch.full_like(p, float(RANK))
        opt.step()
    opt.sync_model()
    finals = hvd.allgather_object(p.tolist(), name=f"contract.torch.uneven.{name}")
    assert all(f == finals[0] for f in finals) and np.isfinite(finals[0]).all()


@pytest.mark.parametrize("name", ["ElasticBSP", "DSSP"])
def test_after_sync_model_the_first_round_is_planned_from_the_measured_speeds(name):
    """A restart after ``sync_model()`` (an epoch's end) plans its first round from the speeds the rounds
    measured, not from two rounds of one step each; the slow rank's one step there is the first after the sync
    (not timed), so the next round runs that plan again."""
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=PLANNED[name](), slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.02))
    for _ in range(12 if RANK < 3 else 6):
        p.grad = torch.ones_like(p)
        opt.step()
    opt.sync_model()
    known = opt._hh.speeds.known()
    seen = len(opt.telemetry.records)
    while sum(r["synced"] for r in opt.telemetry.records[seen:]) < 2:
        p.grad = torch.ones_like(p)
        opt.step()
    opt.sync_model()
    first, second = [r["ranks"]["local_steps"] for r in opt.telemetry.records[seen:] if r["synced"]][:2]
    everyone = hvd.allgather_object((known, first, second), name=f"contract.torch.restart.{name}")
    assert known is not None and all(k == known for k, _, _ in everyone)
    want = PLANNED[name]().plan_steps(np.array(known))
    assert want[3] == 1 and min(want[:3]) >= 2, want
    assert all(f == want and s == want for _, f, s in everyone), everyone
