"""WAGMA under horovodrun -np 4 with S=2: group membership, exact group means, global sync every tau."""
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero.rules.grouping import butterfly_groups
from horovod_hetero.torch.adapter import TorchCollectives

job.init(hvd, hh)                 # HH_TEST_PROCESS_SETS=dynamic: the groups added by the strategy
DYNAMIC = job.DYNAMIC
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks (S=2)")


def wagma_opt(p, group_size=2, **kwargs):
    """Plain SGD with lr 1 and gradient -(rank + 1): every local step adds rank + 1."""
    return hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                   strategy=hh.WAGMA(group_size=group_size, **kwargs))


def step(opt, p, sleep_s=0.0):
    time.sleep(sleep_s)
    p.grad = torch.full_like(p, -(RANK + 1.0))
    opt.step()


def reference_blocking(steps, period):
    """Algorithm 2 without staleness, every rank's model after each step (exact in float64)."""
    w = np.arange(SIZE, dtype=np.float64)
    history = []
    for s in range(1, steps + 1):
        w = w + np.arange(1, SIZE + 1)
        if s % period == 0:
            w[:] = w.mean()
        else:
            for g in butterfly_groups(SIZE, 2, s - 1):
                w[list(g)] = w[list(g)].sum() / 2
        history.append(w.copy())
    return np.array(history)


def test_groups_follow_the_butterfly_and_hold_the_exact_mean_global_every_period():
    p = torch.nn.Parameter(torch.full((3,), float(RANK), dtype=torch.float64))
    opt = wagma_opt(p, sync_period=4, wait_avoiding=False)
    after, groups = [], []
    for _ in range(9):
        step(opt, p)
        after.append(p[0].item())
        groups.append(opt.telemetry.records[-1].get("group"))
    opt.sync_model()
    everyone = hvd.allgather_object((after, groups, p.tolist()), name="wagma.blocking")
    expected = reference_blocking(9, period=4)
    assert np.array_equal(np.array([e[0] for e in everyone]).T, expected)
    for s, g in enumerate(groups, start=1):
        mine = None if s % 4 == 0 else [list(x) for x in butterfly_groups(SIZE, 2, s - 1) if RANK in x][0]
        assert g == mine, (s, g)
    assert all(e[2] == everyone[0][2] for e in everyone)        # sync_model: identical at the end


def test_straggler_is_served_stale_its_peer_does_not_wait_and_line_13_holds():
    """Rank 3 sleeps 1 s in step 2. Its step-2 peer (rank 1) averages with rank 3's step-1 model
    after rank 3's 0.2 s patience; rank 3 then takes (W_sum + W')/3. Step 3 likewise with rank 2.
    The others' patience (0.8 s) covers rank 1's 0.2 s wait, so their own pairs stay fresh."""
    p = torch.nn.Parameter(torch.full((2,), float(RANK), dtype=torch.float64))
    opt = wagma_opt(p, sync_period=4, patience=0.2 if RANK == 3 else 0.8)
    after, stale, waits = [], [], []
    for s in range(1, 5):
        step(opt, p, sleep_s=1.0 if (RANK == 3 and s == 2) else 0.0)
        record = opt.telemetry.records[-1]
        after.append(p[0].item())
        stale.append(record.get("stale"))
        waits.append(record.get("group_s"))
    served_stale = opt._hh.transports.groups.served_stale
    everyone = hvd.allgather_object((after, stale, waits, served_stale), name="wagma.stale")
    opt.sync_model()
    w1 = [2.0, 2.0, 6.0, 6.0]                                       # step 1: fresh pairs (0,1), (2,3)
    w3_2 = (4.0 + 6.0 + 10.0) / 3                                   # rank 3: rank 1's W' + its stale + its W'
    expected2 = [6.0, (4.0 + 6.0) / 2, 6.0, w3_2]                   # pairs (0,2) fresh, (1,3) stale
    expected3 = [7.0, 7.0, (9.0 + 6.0) / 2, (9.0 + 6.0 + (w3_2 + 4.0)) / 3]
    assert [e[0][0] for e in everyone] == w1
    assert [e[0][1] for e in everyone] == expected2
    assert [e[0][2] for e in everyone] == expected3
    assert [e[1][1] for e in everyone] == [False, False, False, True]
    assert [e[1][2] for e in everyone] == [False, False, False, True]
    assert [e[3] for e in everyone] == [0, 0, 0, 2]
    assert everyone[1][2][1] < 0.8 and everyone[2][2][2] < 0.8     # peers did not wait the 1 s out
    finals = [e[0][3] for e in everyone]
    assert finals == [finals[0]] * SIZE                              # step 4: global average
    assert finals[0] == pytest.approx((8.0 + 9.0 + 10.5 + expected3[3] + 4.0) / 4, rel=1e-15)


@pytest.mark.parametrize("group_size", [2, 4], ids=["pairs", "the_whole_job"])
def test_uneven_steps_with_wait_avoidance_end_identical(group_size):
    """Rank r runs 5 + 3r steps; ranks that stop keep serving group averages (weight 0) and
    joining global ones: nobody hangs, and every rank ends with the same model. Also with S = P
    (groups of the whole job, over Horovod's global process set, as a job shrunk to S ranks has)."""
    torch.manual_seed(RANK)
    p = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = wagma_opt(p, group_size, sync_period=3, timeout=60)
    for _ in range(5 + 3 * RANK):
        step(opt, p, sleep_s=0.01 * RANK)
    opt.sync_model()
    finals = hvd.allgather_object(p.tolist(), name="wagma.uneven")
    assert all(f == finals[0] for f in finals)


def reference_epochs(counts, period):
    """Every rank's model after each of its steps, and after each sync_model(), when rank r takes
    ``counts[e][r]`` steps in epoch e and no group average is stale. Shared steps t continue at the
    furthest rank's after each sync; two ranks that step at t average; a rank that stopped gives its
    peers weight 0 and keeps its model; a round (every ``period``-th t, and the sync) weighs 1 each
    rank that stepped since the previous round."""
    w = np.arange(SIZE, dtype=np.float64)
    stepped = np.zeros(SIZE, dtype=bool)
    after, synced, t = [[] for _ in range(SIZE)], [], 0

    def average_round():
        if stepped.any():
            w[:] = w[stepped].sum() / stepped.sum()
        stepped[:] = False

    for n in counts:
        for k in range(1, max(n) + 1):
            t += 1
            active = np.array([k <= n[r] for r in range(SIZE)])
            w[active] += (np.arange(SIZE) + 1.0)[active]
            stepped |= active
            if t % period == 0:
                average_round()
            else:
                for g in butterfly_groups(SIZE, 2, t - 1):
                    members = [r for r in g if active[r]]
                    w[members] = w[members].sum() / max(1, len(members))
            for r in np.flatnonzero(active):
                after[r].append(w[r])
        average_round()
        synced.append(w[0])
    return after, synced


@pytest.mark.parametrize("uneven", [False, True], ids=["equal_steps", "rank_r_takes_3_plus_r"])
@pytest.mark.parametrize("patience", [0.0, 30.0])
def test_sync_model_every_epoch_and_training_goes_on(monkeypatch, patience, uneven):
    """The README's loop with WAGMA: sync_model() after every epoch, three epochs. Rank 1 is 4x
    slower; its padding sleeps between the restart after a sync and its first step's publish, when a
    peer's next group average used to be served with weight 0 unrecorded, and rank 1 then ran that
    group average again alone (hang). After every sync all ranks hold the same model and the same
    shared step t (the furthest rank's), and the groups follow t. With patience 30 s every pair that
    steps at t averages fresh (a stopped rank answers at once), so every value is the reference's."""
    monkeypatch.setenv("HOROVOD_HETERO_BASE_STEP_S", "0.05")
    counts = [[3 + r if uneven else 5 for r in range(SIZE)] for _ in range(3)]
    p = torch.nn.Parameter(torch.full((3,), float(RANK), dtype=torch.float64))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)], slowdown=[1, 4, 1, 1],
                                  timeout=60, strategy=hh.WAGMA(group_size=2, sync_period=4, patience=patience,
                                                                timeout=60))
    after, ts, groups, stale, synced = [], [], [], [], []
    for epoch in counts:
        for _ in range(epoch[RANK]):
            step(opt, p)
            after.append(p[0].item())
            ts.append(opt.strategy.t)
            groups.append(opt.telemetry.records[-1].get("group"))
            stale.append(opt.telemetry.records[-1].get("stale"))
        opt.sync_model()
        synced.append((p.tolist(), opt.strategy.t))
    everyone = hvd.allgather_object((after, ts, groups, stale, synced), name=f"wagma.epochs.{patience}.{uneven}")
    bases = np.cumsum([0] + [max(n) for n in counts]).tolist()
    for r, (_, ts_r, groups_r, _, synced_r) in enumerate(everyone):
        assert ts_r == [bases[e] + k for e, n in enumerate(counts) for k in range(1, n[r] + 1)]
        for t, g in zip(ts_r, groups_r):
            assert g == (None if t % 4 == 0 else [list(x) for x in butterfly_groups(SIZE, 2, t - 1) if r in x][0])
        assert [s[1] for s in synced_r] == bases[1:]
    for e in range(len(counts)):                                     # bit-identical after every sync
        assert all(everyone[r][4][e][0] == everyone[0][4][e][0] for r in range(SIZE)), e
    if patience:
        ref_after, ref_synced = reference_epochs(counts, period=4)
        for r in range(SIZE):
            assert everyone[r][0] == pytest.approx(ref_after[r], rel=1e-12, abs=0.0)
            assert not any(everyone[r][3])
        assert [s[0][0] for s in everyone[0][4]] == pytest.approx(ref_synced, rel=1e-12, abs=0.0)


@pytest.mark.skipif(DYNAMIC, reason="with dynamic process sets the groups are added, not missing")
def test_missing_process_sets_name_the_init_call():
    ops = TorchCollectives(hvd.global_process_set, 5.0)
    with pytest.raises(ValueError, match=r"missing \[\[0, 3\]\].*hvd.init\(process_sets=hh.wagma_process_sets"):
        ops.require_groups([[0, 3]], "hvd.init(process_sets=hh.wagma_process_sets(group_size=2))")
    with pytest.raises(ValueError, match=r"S \(group size\) must be <= P = 4, got 8; e.g. S = 2"):
        wagma_opt(torch.nn.Parameter(torch.zeros(1)), group_size=8)


def test_a_foreign_process_attacking_the_activation_sockets_changes_nothing():
    """While the job trains (wait-avoiding, patience 30 s so every pair averages fresh), a local
    process without the key sends every rank's activation socket garbage, unsealed activations,
    500 forged activations of future steps and raw bytes. Nothing is served for them, no responder
    dies, every value is Algorithm 2's without staleness, and each rank counted what it dropped."""
    p = torch.nn.Parameter(torch.full((3,), float(RANK), dtype=torch.float64))
    opt = wagma_opt(p, sync_period=4, patience=30.0)
    after, intruder = [], None
    for s in range(1, 10):
        step(opt, p, sleep_s=0.05)
        after.append(p[0].item())
        if s == 1 and RANK == 0:
            addresses = opt._hh.transports.groups._activations.addresses
            intruder = subprocess.Popen([sys.executable, str(pathlib.Path(__file__).with_name("intruder.py")),
                                         "activations", *addresses], stdout=subprocess.PIPE, text=True)
        if s == 5 and RANK == 0:
            intruder.communicate(timeout=60)                        # the attack is over by step 6
    groups = opt._hh.transports.groups
    counts = (groups._activations.dropped, groups.dropped, groups.served_stale, groups._thread.is_alive())
    opt.sync_model()
    everyone = hvd.allgather_object((after, counts), name="wagma.intruder")
    assert np.array_equal(np.array([e[0] for e in everyone]).T, reference_blocking(9, period=4))
    for dropped, refused, stale, alive in (e[1] for e in everyone):
        assert dropped >= 504 and (refused, stale, alive) == (0, 0, True)
    if RANK == 0:
        assert intruder.returncode == 0
