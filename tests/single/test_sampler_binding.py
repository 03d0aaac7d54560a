"""``hh.DistributedSampler`` binds to the process's one ``hh.DistributedOptimizer`` (the README's line is
enough); with several it refuses by name; one it is given stays bound. Fakes stand for the optimizers:
the sampler reads only their rounds' step times and step counts (``_hh.step_times``, ...); a first epoch
begun before any speed was known is split again, by speed, once the rounds have measured every rank."""
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import horovod_hetero.torch.sampler as sampler_mod
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.strategies import LocalSGD, Synchronous
from horovod_hetero.torch.sampler import DistributedSampler, register_optimizer


class FakeOptimizer:
    """What the sampler reads of an ``hh.DistributedOptimizer``: the rounds' step times, no strategy."""

    strategy = None

    def __init__(self, step_times):
        steps = [1] * len(step_times)                                 # one round has measured every rank
        self._hh = types.SimpleNamespace(step_times=step_times, steps_seen=steps, speeds_measured=(steps, step_times))


@pytest.fixture(autouse=True)
def no_optimizers(monkeypatch):
    monkeypatch.setattr(sampler_mod, "_optimizers", type(sampler_mod._optimizers)())


def test_the_only_optimizer_is_bound_when_an_epoch_is_first_split():
    sampler = DistributedSampler(range(100), num_replicas=2, rank=1, shuffle=False)
    assert sampler.optimizer is None and len(sampler) == 50          # none yet: an even split, nothing bound
    sampler.set_epoch(1)
    opt = FakeOptimizer([0.1, 0.4])                                   # rank 1 takes 4x as long per step
    register_optimizer(opt)
    assert len(sampler) == 20 and list(sampler) == list(range(80, 100))
    assert sampler.optimizer is opt and opt._hh_split_by_speed
    register_optimizer(FakeOptimizer([0.4, 0.1]))                     # a later one: this sampler stays bound
    sampler.set_epoch(2)
    assert len(sampler) == 20 and sampler.optimizer is opt


def test_several_optimizers_are_refused_with_the_fix_until_one_is_dropped():
    first, second = FakeOptimizer([0.1, 0.1]), FakeOptimizer([0.1, 0.3])
    first.cycle = first                                               # held by a reference cycle, as torch's are
    register_optimizer(first)
    register_optimizer(second)
    sampler = DistributedSampler(range(100), num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(ValueError, match=r"bound to no optimizer, and 2 hh.DistributedOptimizers live in this "
                                         r"process: .*hh.DistributedOptimizer\(\.\.\., sampler=sampler\)"):
        len(sampler)
    del first                                                         # dropped: collected when the sampler looks
    assert len(sampler) == 75 and sampler.optimizer is second


def test_an_optimizer_given_stays_bound_beside_others():
    mine, other = FakeOptimizer([0.3, 0.1]), FakeOptimizer([0.1, 0.3])
    register_optimizer(mine)
    register_optimizer(other)
    sampler = DistributedSampler(range(100), num_replicas=2, rank=0, shuffle=False, optimizer=mine)
    assert len(sampler) == 25 and sampler.optimizer is mine and mine._hh_split_by_speed
    assert not hasattr(other, "_hh_split_by_speed")


def idle_check(waited, since, **state):
    """``_hh_check_idle`` of a wrapper (``state``: its attributes) that last synced ``since`` s ago and
    waited ``waited`` s of it: the warnings it gave."""
    import time
    import warnings

    from horovod_hetero.torch.optimizer import DistributedOptimizer
    now = time.monotonic()
    opt = types.SimpleNamespace(_hh_synced_at=now - since, _hh_idle_warned=False, _hh_split_by_speed=False,
                                _hh=types.SimpleNamespace(runner=runner_for(LocalSGD(period=4))))
    for key, value in state.items():
        setattr(opt, key, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DistributedOptimizer._hh_check_idle(opt, now - waited)
    assert opt._hh_idle_warned == (bool(caught) or state.get("_hh_idle_warned", False))
    return [str(w.message) for w in caught]


def test_a_rank_idle_in_sync_model_with_an_even_split_is_told_the_fix_once():
    said = idle_check(waited=6.0, since=10.0)
    assert len(said) == 1 and said[0].startswith("this rank waited 6.0 s of the 10.0 s since the last sync_model()")
    assert "hh.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())" in said[0]
    assert idle_check(waited=6.0, since=10.0, _hh_idle_warned=True) == []      # once only
    assert idle_check(waited=2.0, since=10.0) == []                      # a quarter or less: no warning
    assert idle_check(waited=6.0, since=10.0, _hh_split_by_speed=True) == []
    assert idle_check(waited=6.0, since=10.0, _hh=types.SimpleNamespace(
        runner=runner_for(Synchronous()))) == []   # Synchronous: it waits every step


def test_loader_batch_size_keeps_every_share_but_the_last_whole_batches():
    """Shares follow the speeds; with the DataLoader's batch size only the last rank's ends short, so
    no rank meets a one-sample batch BatchNorm refuses (1438 samples, batches of 32: the last rank's
    share ends on 30)."""
    speeds = [0.1, 0.13, 0.1, 0.37]
    shares = []
    for r in range(4):
        s = DistributedSampler(range(1438), num_replicas=4, rank=r, loader_batch_size=32)
        s.step_times = lambda: speeds
        shares.append(list(s))
    assert [len(s) % 32 for s in shares] == [0, 0, 0, 1438 % 32]
    assert sorted(i for s in shares for i in s) == list(range(1438))
    with pytest.raises(ValueError, match="loader_batch_size"):
        DistributedSampler(range(10), num_replicas=2, rank=0, loader_batch_size=0)


def test_a_first_epoch_is_split_again_by_speed_once_every_rank_is_measured():
    """100 samples, batches of 5, two ranks split evenly (no speed yet); rank 0 has drawn 12 (its loader
    prefetches) and rank 1 10 when the rounds at 2 steps each have measured rank 1 4x slower: the 80 left go
    65 to rank 0 (its 40 first, then rank 1's last 25) and 15 to rank 1, every sample once."""
    import numpy as np
    controllers = [types.SimpleNamespace(step_times=None, steps_seen=np.zeros(2, dtype=np.int64),
                                         speeds_measured=None) for _ in range(2)]
    iters = []
    for rank, c in enumerate(controllers):
        opt = FakeOptimizer([0.1, 0.4])
        opt._hh = c
        iters.append(iter(DistributedSampler(range(100), num_replicas=2, rank=rank, shuffle=False, optimizer=opt,
                                             loader_batch_size=5)))
    drawn = [[next(iters[0]) for _ in range(12)], [next(iters[1]) for _ in range(10)]]
    for c in controllers:                   # the round: both ranks read the same steps and times from it
        c.speeds_measured = (np.array([2, 2]), np.array([0.1, 0.4]))
        c.step_times, c.steps_seen = c.speeds_measured[1], c.speeds_measured[0]
    shares = [d + list(it) for d, it in zip(drawn, iters)]
    assert shares[0] == list(range(50)) + list(range(75, 100)) and shares[1] == list(range(50, 75))
    assert [len(s) for s in shares] == [75, 25]
    opt = FakeOptimizer([0.1, 0.4])
    opt._hh = types.SimpleNamespace(step_times=None, steps_seen=np.zeros(2, dtype=np.int64), speeds_measured=None)
    unsized = iter(DistributedSampler(range(100), num_replicas=2, rank=1, shuffle=False, optimizer=opt))
    head = [next(unsized) for _ in range(10)]
    opt._hh.speeds_measured = (np.array([2, 2]), np.array([0.1, 0.4]))
    assert head + list(unsized) == list(range(50, 100))     # no loader_batch_size: samples a step unknown, even


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6).flatmap(lambda size: st.tuples(
    st.lists(st.integers(0, 40), min_size=size, max_size=size),
    st.lists(st.integers(0, 40), min_size=size, max_size=size),
    st.lists(st.floats(0.01, 1.0), min_size=size, max_size=size),
    st.integers(1, 4))))
def test_a_resplit_rest_draws_every_sample_once_and_keeps_what_each_rank_drew(case):
    """Whatever each rank drew of its part (up to all of it) and whatever the speeds: the parts drawn
    and the new rests hold every sample once, and each rank's rest begins where its part left off."""
    from horovod_hetero.rules.partition import resplit_rest
    counts, drawn, step_s, multiple = case
    drawn = [min(d, c) for d, c in zip(drawn, counts)]
    order = list(range(sum(counts)))
    starts = [sum(counts[:r]) for r in range(len(counts))]
    rests = [resplit_rest(order, counts, drawn, step_s, r, multiple) for r in range(len(counts))]
    taken = [order[s:s + d] + rest for s, d, rest in zip(starts, drawn, rests)]
    assert sorted(i for t in taken for i in t) == order
    for s, d, c, rest in zip(starts, drawn, counts, rests):
        head = order[s + d:s + c]
        assert rest[:len(head)] == head[:len(rest)]
