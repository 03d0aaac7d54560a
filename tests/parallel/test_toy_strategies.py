"""A strategy is one module and one registry line: the toys of ``toy_strategies`` (one of each kind, each
registered with one ``register`` line) train by name with the unchanged torch adapter under horovodrun.
The Keras half is ``test_toy_strategies_keras.py`` (the Keras jobs run the ``test_*keras*.py`` files)."""
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
import toy_strategies
from horovod_hetero.strategies.registry import REGISTRY, configured

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gather(model, name):
    """Every rank's parameters, one row per rank."""
    return hvd.allgather(flat(model).reshape(1, -1).clone(), name=name)


def identical(rows):
    return bool((rows == rows[0]).all())


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def train(name, model, steps):
    """``steps`` steps of ``configured(name)`` on this rank's own batches; per step: every rank's parameters
    identical after it, and its telemetry record; then ``sync_model()``'s parameters of every rank."""
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), strategy=configured(name))
    g = torch.Generator().manual_seed(100 + RANK)
    after = []
    for step in range(steps):
        x, y = torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        after.append(identical(gather(model, f"toy.torch.{name}.{step}")))
    opt.sync_model()
    return opt, after, gather(model, f"toy.torch.{name}.final")


def test_each_toy_is_registered_by_its_one_line_and_exported_by_name():
    assert REGISTRY["everythird"].cls is toy_strategies.EveryThird is hh.EveryThird
    assert REGISTRY["measureeveryfourth"].cls is toy_strategies.MeasureEveryFourth is hh.MeasureEveryFourth
    assert REGISTRY["everythird"].defaults == {} and type(configured("everythird")) is toy_strategies.EveryThird


def test_the_model_averaging_toy_averages_every_third_step_and_ends_identical():
    model = make_model(seed=RANK)                     # a different start on every rank
    opt, after, final = train("everythird", model, 7)
    rounds = [r["step"] for r in opt.telemetry.records if r["synced"]]
    assert rounds == [3, 6] and rounds == [r["step"] for r in opt.telemetry.records if "round" in r]
    assert after == [False, False, True, False, False, True, False]   # identical only after a round
    assert identical(final) and opt.strategy.step == 7


def test_the_gradient_averaging_toy_steps_in_lockstep_and_measures_every_fourth_step():
    model = make_model(seed=0)                        # one start: Horovod averages every step's gradients
    opt, after, final = train("measureeveryfourth", model, 9)
    records = opt.telemetry.records
    assert [r["step"] for r in records if "round" in r] == [4, 8]     # rounds that measured
    assert not any(r["synced"] for r in records)                       # and averaged no model
    assert all(after) and identical(final) and opt.strategy.step == 9
    assert len(records[3]["ranks"]["step_s"]) == SIZE                 # every rank's step time, measured
