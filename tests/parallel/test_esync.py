"""ESync under horovodrun -np 4 with ranks slowed 1,1,1,4: real state server, real allreduce."""
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.runtime.straggler import Slowdown
from test_torch import GRAD, GRADS, RANK, SIZE, constant_grad_step

UNREACHABLE = "tcp://127.0.0.1:9"       # nothing listens on the discard port


def slowed():
    return Slowdown(RANK, "1,1,1,4", base_step_s=0.03)


INTRUDER = pathlib.Path(__file__).with_name("intruder.py")


def run_rounds(opt, p, rounds, on_step=lambda: None):
    """Step until `rounds` rounds are done; the model after each round; local steps per round."""
    after = []
    while opt.strategy.round < rounds:
        constant_grad_step(opt, [p], [GRAD])
        on_step()
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


def test_the_papers_global_lr_as_an_outer_lr_moves_the_global_model_part_way():
    """ESync's w_{t+1} = w_t + epsilon (mean_i w_i - w_t), epsilon = 0.5 given as aggregate=hh.Mean(outer=
    hh.OuterSGD(lr=0.5)); deterministic local steps (fallback every 2)."""
    p = torch.nn.Parameter(torch.full((1,), float(RANK)))         # different starts: averaged first
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=hh.ESync(server_address=UNREACHABLE, timeout=0.3, fallback_period=2),
                                  aggregate=hh.Mean(outer=hh.OuterSGD(lr=0.5)))
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


def test_a_foreign_process_attacking_the_state_server_changes_nothing():
    """While the job trains (ranks slowed 1,1,1,4), a local process without the key sends the state
    server garbage, a 100 kB line, nested JSON, queries posing as rank 1 with a huge capability or
    out of range, ``leave`` for rank 3, ``Infinity``, a made-up MAC, and holds 100 connections.
    Rank 0 waits for the attack after its first step (ranks 1-3 train and query on meanwhile), so
    its second step looks 2 s long and shapes rounds 1-2; from round 3 on the rounds are what they
    are without an attack: rank 3 one step per round, the others several, the models bit-identical
    after every round, no fallback; rank 0's server counted what it refused."""
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)],
                                  strategy=hh.ESync(mode="blocking"), slowdown=slowed())
    attacks = []

    def attack():
        server = opt._hh.transports.server
        if server is not None and not attacks:
            intruder = subprocess.run([sys.executable, str(INTRUDER), "state", server.address, str(SIZE)],
                                      capture_output=True, text=True, timeout=60)
            attacks.append((intruder.returncode, intruder.stdout, intruder.stderr, server))

    after, per_round = run_rounds(opt, p, rounds=12, on_step=attack)
    everyone = hvd.allgather_object((after, per_round, opt.strategy.fallback), name="esync.intruder")
    if RANK == 0:
        returncode, out, err, server = attacks[0]
        assert returncode == 0 and int(out) >= 25, err
        assert server.rejected >= 30 and server.refused >= 100 - (SIZE + 64), (server.rejected, server.refused, server.failures)  # 100 held, P + 64 may wait
    afters = [e[0] for e in everyone]
    assert all(a == afters[0] for a in afters) and len(afters[0]) == 12
    assert everyone[3][1][2:] == [1] * 10 and not any(e[2] for e in everyone)
    for fast in everyone[:3]:
        assert np.mean(fast[1][2:]) >= 2.5, fast[1]


def test_rank_0_stopped_longer_than_the_query_timeout_does_not_split_the_ranks():
    """Issue 16's stall: in round 3 rank 0 (the state server's process) is stopped (SIGSTOP) for
    1.5 s, longer than the 0.5 s query timeout. Ranks that time out fall back for that round only
    and tell the server they entered it, so every rank reaches every round (before: ranks 1-3 fell
    back for good and rank 0 never became ready again); the models are bit-identical after every
    round, and the last rounds all use the server again."""
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), named_parameters=[("p", p)], timeout=30,
                                  strategy=hh.ESync(mode="blocking", timeout=0.5, fallback_period=4),
                                  slowdown=slowed())
    stopper, fell_back = [], set()

    def stop_rank_0():
        if opt.strategy.fallback:
            fell_back.add(opt.strategy.round)
        if RANK == 0 and opt.strategy.round == 3 and not stopper:
            pid = os.getpid()
            stopper.append(subprocess.Popen(["sh", "-c", f"sleep 0.1; kill -STOP {pid}; sleep 1.5; kill -CONT {pid}"]))

    t0 = time.monotonic()
    after, _ = run_rounds(opt, p, rounds=10, on_step=stop_rank_0)
    elapsed = time.monotonic() - t0
    everyone = hvd.allgather_object((after, sorted(fell_back), elapsed), name="esync.sigstop")
    if RANK == 0:
        assert stopper[0].wait(10) == 0
    afters = [e[0] for e in everyone]
    assert all(a == afters[0] for a in afters) and len(afters[0]) == 10
    rounds_fallen_back = sorted(set().union(*(e[1] for e in everyone)))
    assert rounds_fallen_back and set(rounds_fallen_back) <= {3, 4}, rounds_fallen_back
    assert max(e[2] for e in everyone) < 30
