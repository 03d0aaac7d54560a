"""Balanced under horovodrun (torch): the averaged gradient is the gradient of the union of the ranks'
unequal batches, every step leaves identical models, and under slowdown the slow rank gets the smallest
batch."""
import numpy as np
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero.runtime.straggler import Slowdown

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)          # 4 ranks on 2 cores: torch's own threads would make the step times noise


def gather(t):
    return hvd.allgather(t.detach().reshape(1, -1).clone(), name="test.balanced.gather").numpy()


def dataset(n=400):
    g = torch.Generator().manual_seed(7)
    return torch.utils.data.TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def test_the_averaged_gradient_is_the_union_batchs_for_unequal_batches():
    """A global batch of 10 over 4 ranks: batches of 3, 3, 2, 2; after one step of SGD (lr 1) every rank
    holds the model a single process gets from the mean loss over the union of the 10 samples."""
    data = dataset()
    model = model_of()
    before = [p.detach().clone() for p in model.parameters()]
    sampler = hh.DistributedSampler(data, batch_size=3, seed=5)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters(),
                                  strategy=hh.Balanced(global_batch=10), sampler=sampler)
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    sizes = hvd.allgather_object(len(y), name="test.balanced.sizes")
    everyone = gather(flat(model))
    opt.sync_model()

    reference = model_of()
    with torch.no_grad():
        for p, b in zip(reference.parameters(), before):
            p.copy_(b)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(5)).tolist()[:10]
    xs, ys = data[order]
    torch.nn.functional.cross_entropy(reference(xs), ys).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= p.grad
    assert sizes == [3, 3, 2, 2]
    assert (everyone == everyone[0]).all()
    np.testing.assert_allclose(everyone[0], flat(reference).numpy(), rtol=0, atol=2e-6)


def test_every_step_leaves_identical_models_and_the_slow_rank_gets_the_smallest_batch():
    data = dataset(4000)
    model = model_of()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = hh.DistributedSampler(data, batch_size=16)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    # a step padded to 2 ms a sample, the last rank's to 8 ms (these models take microseconds a sample: their
    # own compute is noise no line fits; the padding is a step time Balanced can equalise)
    slowdown = Slowdown(RANK, "1,1,1,4", base_step_s=0.0, per_sample_s=0.002)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  strategy=hh.Balanced(rebalance_every=5), sampler=sampler, slowdown=slowdown)
    models, batches = [], []
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.telemetry.annotate(samples=len(y))
        opt.step()
        models.append(flat(model))
        batches.append(len(y))
        if len(batches) == 40:
            break
    opt.sync_model()
    everyone = hvd.allgather_object((torch.stack(models).numpy(), batches), name="test.balanced.steps")
    for other, their_batches in everyone[1:]:
        np.testing.assert_array_equal(other, everyone[0][0])
    per_step = np.array([b for _, b in everyone])                     # (ranks, steps)
    assert (per_step.sum(axis=0) == 64).all()
    assert (per_step[:, :15] == 16).all()                               # windows 0-2: the even split
    assert (per_step[SIZE - 1, 15:] < per_step[:SIZE - 1, 15:].min(axis=0)).all(), per_step[:, 15:]


def test_a_rank_that_stops_a_step_early_is_absent_from_the_rebalancing_round_and_all_end_alike():
    """As a time budget on each rank's own clock may do: the last rank stops after step 14 and waits in
    sync_model (Horovod's join, zeros for every allreduce) while the others take step 15, whose
    rebalancing round it answers with zeros. The plan made at step 10 (for window 3) stands; every rank
    ends with the same model and the counters of the rank that joined last (15 steps, 3 rounds), so
    training again continues alike."""
    data = dataset(4000)
    model = model_of()
    sampler = hh.DistributedSampler(data, batch_size=16)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  strategy=hh.Balanced(rebalance_every=5), sampler=sampler)
    stop_after = 14 if RANK == SIZE - 1 else 15
    for step, (x, y) in enumerate(loader, start=1):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.telemetry.annotate(samples=len(y))
        opt.step()
        if step == stop_after:
            break
    opt.sync_model()
    everyone = hvd.allgather_object((flat(model).numpy(), opt._hh.state_dict()), name="test.balanced.early")
    for weights, counters in everyone:
        np.testing.assert_array_equal(weights, everyone[0][0])
        assert counters == everyone[0][1]
    mine = everyone[RANK][1]
    assert mine["strategy"]["step"] == 15 and mine["rounds"]["round"] == 3
    assert list(mine["strategy"]["plans"]) == ["3"] and sum(mine["strategy"]["plans"]["3"]) == 64
