"""``aggregate=hh.Normalized(...)`` and ``hh.Mean(outer=OuterSGD(...))`` under horovodrun (torch): exact values from an
independent reference, identical models after every round, the slow rank's data weighted up, and a resume
from a checkpoint that continues bit for bit with the outer momentum."""
import io

import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from fixed_plan import FixedPlan, reference

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
TAUS = [4] * (SIZE - 1) + [1]
GRADS = [-(r + 1.0) for r in range(SIZE)]
VARIANTS = {"mean": ("mean", None), "normalized": ("normalized", None),
            "normalized+nesterov": ("normalized", (0.5, 0.5, True)), "mean+momentum": ("mean", (0.5, 0.5, False))}


def gather(t):
    return hvd.allgather(t.detach().reshape(1, -1).clone(), name="test.aggregation.gather").numpy()


def aggregation_of(aggregate, spec):
    """The ``aggregate=`` of a variant: ``hh.Mean``/``hh.Normalized`` with the outer optimiser ``spec`` gives."""
    outer = None if spec is None else hh.OuterSGD(lr=spec[0], momentum=spec[1], nesterov=spec[2])
    return {"mean": hh.Mean, "normalized": hh.Normalized}[aggregate](outer)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_round_gives_every_rank_the_reference_value(variant):
    """Rank r's gradient is -(r + 1), constant; ranks take 4, 4, 4, 1 local steps per round (lr 1)."""
    aggregate, outer = VARIANTS[variant]
    p = torch.nn.Parameter(torch.zeros(3))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=FixedPlan(), aggregate=aggregation_of(aggregate, outer))
    seen = []
    while len(seen) < 4:
        p.grad = torch.full_like(p, GRADS[RANK])
        opt.telemetry.annotate(samples=32)
        opt.step()
        if opt.telemetry.records[-1]["synced"]:
            seen.append(gather(p))
    opt.sync_model()
    want = reference(GRADS, TAUS, 4, aggregate, outer)
    for i, (got, w) in enumerate(zip(seen, want), start=1):
        assert (got == np.float32(w)).all(), f"round {i}: {got[:, 0]} != {w}"


def skewed_problem(aggregate, rounds=6):
    """Logits of SIZE classes (a bias, no input); rank r's data are all of class r, the last rank steps
    once per round, the others four times. Returns every rank's softmax after the rounds."""
    bias = torch.nn.Parameter(torch.zeros(SIZE))
    opt = hh.DistributedOptimizer(torch.optim.SGD([bias], lr=0.5), named_parameters=[("bias", bias)],
                                  strategy=FixedPlan(), aggregate=aggregation_of(aggregate, None))
    target = torch.full((8,), RANK)
    done = 0
    while done < rounds:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(bias.expand(8, SIZE), target).backward()
        opt.telemetry.annotate(samples=8)
        opt.step()
        done += opt.telemetry.records[-1]["synced"]
    opt.sync_model()
    return gather(torch.softmax(bias.detach(), 0))


def test_normalized_gives_the_slow_ranks_class_more_weight_than_mean():
    mean, normalized = skewed_problem("mean"), skewed_problem("normalized")
    for probs in (mean, normalized):
        assert (probs == probs[0]).all()                          # identical on every rank
    mean, normalized = mean[0], normalized[0]
    slow = SIZE - 1
    assert mean[slow] < mean[:slow].min() - 0.05, mean            # plain averaging: the fast ranks' classes win
    assert normalized[slow] > mean[slow] + 0.05, (mean, normalized)
    assert abs(normalized[slow] - normalized[:slow].mean()) < abs(mean[slow] - mean[:slow].mean()) / 2, normalized


def batches(step):
    """Rank-specific data of local step ``step`` (the same in a resumed run)."""
    g = torch.Generator().manual_seed(1000 * RANK + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def train(model, opt, first, rounds):
    """Local steps from ``first`` until ``rounds`` rounds; returns the next step and the rounds' models."""
    step, seen = first, []
    while len(seen) < rounds:
        x, y = batches(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.telemetry.annotate(samples=8)
        opt.step()
        step += 1
        if opt.telemetry.records[-1]["synced"]:
            seen.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
    return step, seen


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), strategy=FixedPlan(),
                                  aggregate=hh.Normalized(outer=hh.OuterSGD(lr=0.7, momentum=0.5, nesterov=True)))
    return model, opt


def test_a_resume_from_a_checkpoint_continues_bit_identically_with_outer_momentum():
    model, opt = build(seed=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step, _ = train(model, opt, 0, rounds=3)
    opt.sync_model()                       # where scripts checkpoint: every rank at the same round
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, buffer)
    saved = opt.state_dict()["param_groups"][0]["horovod_hetero"]
    _, after = train(model, opt, step, rounds=3)
    opt.sync_model()

    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=False)
    resumed_model, resumed_opt = build(seed=1)             # other initial weights: all come from the checkpoint
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["opt"])
    _, again = train(resumed_model, resumed_opt, checkpoint["step"], rounds=3)
    resumed_opt.sync_model()
    assert saved["aggregation"]["momentum"] is not None and len(saved["aggregation"]["start"]) == 1
    for i, (a, b) in enumerate(zip(after, again), start=1):
        assert torch.equal(a, b), f"round {i} after the resume differs"
