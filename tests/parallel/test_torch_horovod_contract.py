"""Horovod's optimizer contract with ``hh.DistributedOptimizer``, for every strategy: the functions
Horovod users call on an optimizer (``broadcast_optimizer_state``, ``broadcast_object``,
``hvd.elastic.TorchState``) behave as with ``hvd.DistributedOptimizer``; non-members of the process set
wrap and step locally; Adasum, warnings and errors as Horovod's."""
import copy
import warnings

import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod.torch.optimizer import _DistributedAdasumOptimizer

SETS = job.init(hvd, hh)
PAIR = next(ps for ps in SETS if ps.ranks == [0, 1])
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks")

STRATEGIES = {"Synchronous": hh.Synchronous, "LocalSGD": lambda: hh.LocalSGD(period=2),
              "ESync": hh.ESync, "WAGMA": lambda: hh.WAGMA(group_size=2, sync_period=2),
              "ElasticBSP": hh.ElasticBSP, "DSSP": hh.DSSP}


def build(strategy, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), strategy=STRATEGIES[strategy]())
    return model, opt


def train(model, opt, steps):
    for i in range(steps):
        opt.zero_grad()
        model(torch.full((4, 3), float(RANK + i))).pow(2).mean().backward()
        opt.step()


def counters(opt):
    return opt.state_dict()["param_groups"][0]["horovod_hetero"]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_resume_rank0_loads_then_broadcast_optimizer_state(strategy):
    """Horovod's resume recipe: only rank 0 has state (it loaded a checkpoint); no deadlock, every
    rank takes rank 0's optimizer state and counters, and training goes on in matching rounds."""
    model, opt = build(strategy)
    train(model, opt, 3)
    opt.sync_model()
    checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    model, opt = build(strategy, seed=1)
    if RANK == 0:
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = counters(opt)
    everyone = hvd.allgather_object((mine, [v.tolist() for v in opt.state_dict()["state"][0].values()]),
                                    name=f"{strategy}.resumed")
    assert all(e == everyone[0] for e in everyone)
    assert mine == checkpoint["optimizer"]["param_groups"][0]["horovod_hetero"] or RANK != 0
    assert opt.strategy.step == checkpoint_step(checkpoint) == 3
    train(model, opt, 3)                     # rounds match: no RoundMismatchError, no hang
    opt.sync_model()
    final = hvd.allgather_object([p.tolist() for p in model.parameters()], name=f"{strategy}.final")
    assert all(f == final[0] for f in final)


def checkpoint_step(checkpoint):
    return checkpoint["optimizer"]["param_groups"][0]["horovod_hetero"]["strategy"]["step"]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_state_creating_step_is_not_a_training_step(strategy):
    model, opt = build(strategy)
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)       # empty state: Horovod steps with zero gradients
    assert opt.strategy.step == 0 and opt.telemetry.records == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(opt.state_dict()["state"]) == 2              # momentum buffers were created
    opt.sync_model()


def test_counters_travel_with_broadcast_object_and_elastic_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), strategy=hh.LocalSGD(period=5))
    train(model, opt, 1 + RANK)                              # different counters on every rank (no round yet)
    opt.load_state_dict(hvd.broadcast_object(opt.state_dict(), root_rank=0, name="bo"))
    assert counters(opt)["strategy"]["step"] == 1 and opt.strategy.step == 1    # rank 0's, everywhere
    elastic = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)
    train(model, opt, 1)
    elastic.restore()                                        # back to the counters saved at construction
    assert counters(opt)["strategy"]["step"] == 1
    elastic.sync()                                           # Horovod's broadcast from rank 0: no deadlock
    train(model, opt, 4)                                     # steps 2..5: step 5 averages on every rank
    assert opt.strategy.step == 5 and [r["synced"] for r in opt.telemetry.records[-4:]] == [False] * 3 + [True]
    opt.sync_model()


@pytest.mark.parametrize("strategy", ["Synchronous", "LocalSGD"])
def test_non_members_of_the_process_set_wrap_and_step_locally(strategy):
    model, opt = build_on(PAIR, STRATEGIES[strategy]())
    w0 = [p.detach().clone() for p in model.parameters()]
    train(model, opt, 4)
    opt.sync_model()
    copied = copy.deepcopy(opt.param_groups)[0]["horovod_hetero"]      # the live counters, copied
    assert copied == (None if RANK >= 2 else counters(opt))              # outside the set: none
    params = hvd.allgather_object([p.tolist() for p in model.parameters()], name=f"pair.{strategy}")
    assert params[0] == params[1]                            # members averaged
    if RANK >= 2:
        assert not all(torch.equal(a, b) for a, b in zip(w0, model.parameters()))   # stepped locally
        assert params[2] != params[3]


def build_on(process_set, strategy):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=process_set,
                                  named_parameters=model.named_parameters(), strategy=strategy)
    return model, opt


def test_adasum_is_routed_to_horovods_adasum_optimizer_under_mpi_and_refused_by_name_under_gloo():
    model = torch.nn.Linear(3, 2)
    if hvd.mpi_enabled():
        opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
        assert type(opt._hh_gradients._engine)._hh_base is _DistributedAdasumOptimizer
        assert isinstance(opt._hh_gradients._engine, torch.optim.SGD) and isinstance(opt.optimizer, torch.optim.SGD)
    else:                                   # Horovod's own wrapper would fail at the first step
        with pytest.raises(ValueError, match="op=hvd.Adasum needs Horovod's MPI controller"):
            hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="non-global process sets"):
        hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum, process_set=PAIR)
    with pytest.raises(ValueError, match="op must be hvd.Average"):
        hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                strategy=hh.LocalSGD(period=2))


def test_horovods_warnings_fire():
    model = torch.nn.Linear(3, 2)
    with pytest.warns(DeprecationWarning, match="num_groups"):
        opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), num_groups=1)
    model(torch.ones(2, 3)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    model(torch.ones(2, 3)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.sync_model()


def test_after_an_elastic_reset_a_non_global_process_set_is_a_named_error(monkeypatch):
    """hvd.elastic's reset keeps only the global process set; the wrapper notices Horovod's new ranks
    at the next step (here: Horovod's rank and size seen as changed) and names the problem."""
    model, opt = build_on(PAIR, hh.LocalSGD(period=2))
    train(model, opt, 2)
    opt.sync_model()
    monkeypatch.setattr(hvd, "size", lambda: 8)                  # as if Horovod had been initialised again
    with pytest.raises(hh.ElasticResetError, match=r"did not survive it: with hvd.elastic, train over the global"):
        train(model, opt, 1)
