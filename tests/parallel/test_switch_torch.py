"""Switching strategies in one job (torch): Synchronous, ESync, Balanced and ElasticBSP in turn, an epoch
each, over one ``hh.DistributedSampler`` batch sampler: identical models after every switch, every sample once
per epoch, the step counter carried; a checkpoint taken after a switch brings the new strategy back; a user's
subclass of the wrapper works; Horovod's ``broadcast_optimizer_state`` takes no counted step."""
import io

import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero.runtime.straggler import Slowdown

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)
N = 8 * SIZE * 6                     # six global batches of 8 per rank an epoch


class Indexed(torch.utils.data.Dataset):
    """Samples that carry their index, to count what every rank drew."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def gathered(obj, name):
    return hvd.allgather_object(obj, name=name)


def test_one_job_switches_between_both_kinds_with_identical_models_and_every_sample_once_an_epoch():
    data = Indexed(N)
    model = model_of(RANK)                                   # different start on every rank: the first sync fixes it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = hh.DistributedSampler(data, batch_size=8, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), sampler=sampler,
                                  slowdown=Slowdown(RANK, "1,1,1,4", base_step_s=0.01))
    schedule = [None, hh.ESync(), hh.Balanced(rebalance_every=2), hh.ElasticBSP(), hh.Synchronous()]
    seen, models, names, steps = [], [], [], []
    for epoch, strategy in enumerate(schedule):
        if strategy is not None:
            opt.set_strategy(strategy)
        sampler.set_epoch(epoch)
        drawn = []
        for idx, x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            drawn += idx.tolist()
        opt.sync_model()
        seen.append(drawn)
        models.append(flat(model).tolist())
        names.append(type(opt.strategy).__name__)
        steps.append(opt.strategy.step)
    everyone = gathered((seen, models, names, steps), name="test.switch.torch")
    for epoch in range(len(schedule)):
        drawn = [i for rank in everyone for i in rank[0][epoch]]
        assert set(drawn) == set(range(N)), epoch                              # every sample, every epoch
        assert all(rank[1][epoch] == everyone[0][1][epoch] for rank in everyone), epoch   # identical models
    assert all(rank[2] == ["Synchronous", "ESync", "Balanced", "ElasticBSP", "Synchronous"] for rank in everyone)
    per_epoch = N // (8 * SIZE)                              # the batch sampler: every rank the same steps
    assert [s for s in everyone[0][3]][:1] == [per_epoch] and all(s == everyone[0][3] for s in (r[3] for r in everyone))
    assert everyone[0][3] == [per_epoch * (e + 1) for e in range(len(schedule))]   # the step counter carried on


def test_a_checkpoint_taken_after_a_switch_restores_the_new_strategy_and_its_counters():
    model = model_of(0)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(4, 6)).sum().backward()
        opt.step()
    opt.set_strategy(hh.DSSP(staleness=(2, 8)))
    for _ in range(5):
        opt.zero_grad()
        model(torch.ones(4, 6) * (RANK + 1)).sum().backward()
        opt.step()
    opt.sync_model()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    saved = opt.strategy.state_dict()

    restored_model = model_of(0)
    restored = hh.DistributedOptimizer(torch.optim.SGD(restored_model.parameters(), lr=0.05),
                                       named_parameters=restored_model.named_parameters())     # built as Synchronous
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    restored.state_dict()                                     # adopts the counters it holds now
    strategy = restored.strategy
    assert type(strategy).__name__ == "DSSP" and (strategy.s_lower, strategy.s_upper) == (2, 8)
    assert strategy.state_dict() == saved and strategy.step == 8
    restored.zero_grad()
    restored_model(torch.ones(4, 6)).sum().backward()
    restored.step()                                           # it runs: rounds of DSSP
    restored.sync_model()
    assert gathered(flat(restored_model).tolist(), name="test.switch.restored")[0] == flat(restored_model).tolist()


class Clipped(hh.DistributedOptimizer):
    """A user's subclass: clips every gradient before the step (its own step calls the wrapper's)."""

    def __init__(self, *args, max_norm=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_norm, self.clipped = max_norm, 0

    def step(self, closure=None):
        self.synchronize()
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], self.max_norm)
        self.clipped += 1
        with self.skip_synchronize():
            return super().step(closure)


def test_a_users_subclass_of_the_wrapper_works_under_both_kinds():
    model = model_of(0)
    opt = Clipped(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), max_norm=0.5)
    for strategy in (None, hh.LocalSGD(period=2)):
        if strategy is not None:
            opt.set_strategy(strategy)
        for _ in range(4):
            opt.zero_grad()
            (model(torch.ones(4, 6) * (RANK + 1)).sum() * 100).backward()
            opt.step()
        opt.sync_model()
    everyone = gathered((flat(model).tolist(), opt.clipped, opt.strategy.step), name="test.switch.subclass")
    assert all(rank == everyone[0] for rank in everyone) and everyone[0][1:] == (8, 8)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt.optimizer, torch.optim.SGD)


def test_broadcast_optimizer_state_makes_state_with_the_wrapped_step_not_a_counted_one():
    model = model_of(0)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), strategy=hh.LocalSGD(period=2))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.strategy.step == 0 and len(opt.state) == len(list(model.parameters()))   # momentum buffers made
