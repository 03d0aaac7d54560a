"""ESync under horovodrun -np 4 with ranks slowed 1,1,1,4: real state server, real allreduce."""
import numpy as np
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.runtime.straggler import Slowdown
from test_torch import GRAD, GRADS, RANK, SIZE, constant_grad_step

UNREACHABLE = "tcp://127.0.0.1:9"       # nothing listens on the discard port


def slowed():
    return Slowdown(RANK, "1,1,1,4", base_step_s=0.03)


def run_rounds(opt, p, rounds):
    """Step until `rounds` rounds are done; the model after each round; local steps per round."""
    after = []
    while opt.strategy.round < rounds:
        constant_grad_step(opt, [p], [GRAD])
        if opt.telemetry.records[-1]["synced"]:
            after.append(p.detach().clone().tolist())
    opt.sync_model()
    per_round = [r["local_steps"] for r in opt.telemetry.records if r["synced"]]
    return after, per_round


def check_rounds(mode):
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=hh.ESync(mode=mode), slowdown=slowed())
    after, per_round = run_rounds(opt, p, rounds=6)
    everyone = hvd.allgather_object((after, per_round, p.tolist(), opt.strategy.fallback), name=f"esync.{mode}")
    return everyone


def test_blocking_slow_rank_one_step_fast_ranks_several_identical_after_every_round():
    everyone = check_rounds("blocking")
    afters = [e[0] for e in everyone]
    assert all(a == afters[0] for a in afters) and len(afters[0]) == 6      # bit-identical, each round
    assert everyone[3][1][1:] == [1] * 5          # the slowest: one step (round 1 has the warm-up step)
    for fast in everyone[:3]:
        assert np.mean(fast[1]) >= 2.5, fast[1]                              # ~4 fit in a slow step
    assert all(e[2] == everyone[0][2] for e in everyone) and not any(e[3] for e in everyone)


def test_delayed_ack_rounds_stay_matched():
    everyone = check_rounds("delayed_ack")
    afters = [e[0] for e in everyone]
    assert all(a == afters[0] for a in afters) and len(afters[0]) == 6
    assert everyone[3][1][1:] == [1] * 5                 # after the first round it knows it is slowest
    assert all(np.mean(fast[1]) >= 2.0 for fast in everyone[:3])


def test_unreachable_server_falls_back_and_equals_localsgd_bit_for_bit():
    """epsilon = 1 with equal local steps is model averaging: with the server unreachable every
    rank falls back to averaging every 3 steps, which must be LocalSGD(3) exactly."""
    p, q = (torch.nn.Parameter(torch.full((2,), float(RANK))) for _ in range(2))
    esync = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.5, momentum=0.9), named_parameters=[("p", p)],
                                    strategy=hh.ESync(server_address=UNREACHABLE, timeout=0.3, fallback_period=3))
    local = hh.DistributedOptimizer(torch.optim.SGD([q], lr=0.5, momentum=0.9), named_parameters=[("q", q)],
                                    strategy=hh.LocalSGD(3))
    same = []
    for step in range(8):
        constant_grad_step(esync, [p], [GRAD * (step + 1)])
        constant_grad_step(local, [q], [GRAD * (step + 1)])
        same.append(torch.equal(p, q))
    assert all(same) and esync.strategy.fallback
    assert [r["synced"] for r in esync.telemetry.records] == [False, False, True] * 2 + [False, False]


def test_global_lr_moves_the_global_model_part_way():
    """w_{t+1} = w_t + 0.5 (mean_i w_i - w_t), deterministic local steps (fallback every 2)."""
    p = torch.nn.Parameter(torch.full((1,), float(RANK)))         # different starts: averaged first
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=hh.ESync(global_lr=0.5, server_address=UNREACHABLE, timeout=0.3,
                                                    fallback_period=2))
    g = np.arange(SIZE).mean()                                    # the global model w_t
    w = np.full(SIZE, g)
    seen, want = [], []
    for step in range(1, 7):
        constant_grad_step(opt, [p], [GRAD])
        w = w - GRADS
        if step % 2 == 0:
            g = g + 0.5 * (w.mean() - g)
            w = np.full(SIZE, g)
        seen.append(p.item())
        want.append(w[RANK])
    assert seen == want
