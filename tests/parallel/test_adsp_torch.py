"""ADSP under horovodrun, torch: every rank holds the same commit target after every round, the
models are bit-identical after each round, fast ranks run more local steps per commit than the slow
one, and ranks that stop at different steps end identical without a hang."""
import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero.runtime.straggler import Slowdown

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def adsp():
    # Γ = 5 steps of the slowest rank (0.1 s): a commit every 0.5 s at rate 1; a trial needs 3 rounds
    return hh.ADSP(check_period="5steps", search_every="50steps", fit_points=3)


def trained(rounds, slowdown="1,1,1,4"):
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.02), named_parameters=[("p", p)],
                                  strategy=adsp(), slowdown=Slowdown(RANK, slowdown, base_step_s=0.025))
    after, targets, generator = [], [], torch.Generator().manual_seed(RANK)
    while len(after) < rounds:
        opt.zero_grad()
        loss = ((p - torch.randn(3, generator=generator) * 0.1 - 2.0) ** 2).sum()
        loss.backward()
        opt.report_loss(loss)
        opt.step()
        if opt.telemetry.records[-1]["synced"]:
            after.append(p.tolist())
            targets.append((opt.strategy.c_target, opt.strategy.commit_rate, opt.strategy.elapsed))
    opt.sync_model()
    records = [r for r in opt.telemetry.records if r["synced"]]
    searches = [r["search"] for r in records if "search" in r]
    return targets, after, [r["ranks"]["local_steps"] for r in records], searches, p.tolist(), records[-1]["loss"]


def test_every_rank_commits_at_the_same_rate_and_fast_ranks_step_more_per_commit():
    everyone = hvd.allgather_object(trained(rounds=12), name="adsp.torch.rates")
    targets, afters, steps, searches, finals, losses = zip(*everyone)
    assert all(t == targets[0] for t in targets), targets              # C_target, rate, time axis
    assert all(a == afters[0] for a in afters)                          # bit-identical after every round
    assert all(f == finals[0] for f in finals)
    assert all(s == searches[0] for s in searches) and searches[0], searches
    assert searches[0][0]["candidate"] == 1 and "reward" in searches[0][0]
    assert [c for c, _, _ in targets[0][:3]] == [None, 3, 4]           # warm-up; then c_i + 1 at each checkpoint
    steady = np.array(steps[0][2:])                                    # after the two warm-up rounds
    fast, slow = steady[:, :3].min(axis=1), steady[:, 3]
    assert (fast >= slow).all() and (fast > slow).mean() >= 0.8, steps[0]
    assert steady[:, :3].sum() >= 2.5 * 3 * slow.sum(), steps[0]       # 4:1 speeds: ~4x the steps per commit
    assert all(isinstance(loss, float) for loss in losses)


@pytest.mark.timeout(60)
def test_ranks_that_stop_at_different_steps_end_identical_without_a_hang():
    p = torch.nn.Parameter(torch.full((2,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], strategy=adsp(),
                                  slowdown=Slowdown(RANK, [1, 1, 2, 4], base_step_s=0.01))
    for _ in range(10 + 25 * RANK):                                    # 10, 35, 60, 85 steps
        p.grad = torch.full_like(p, float(RANK))
        opt.report_loss(float(RANK + 1))
        opt.step()
    opt.sync_model()
    finals = hvd.allgather_object((p.tolist(), opt.strategy.c_target), name="adsp.torch.uneven")
    assert all(f == finals[0] for f in finals) and np.isfinite(finals[0][0]).all()


def test_report_loss_takes_numbers_and_one_element_tensors_only():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], strategy=adsp())
    opt.report_loss(torch.tensor(0.25))
    assert opt.telemetry.pending["loss"] == 0.25
    for bad in ("0.5", None, torch.ones(2)):
        with pytest.raises(TypeError, match="loss must be a number or a one-element tensor"):
            opt.report_loss(bad)
