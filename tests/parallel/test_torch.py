"""PyTorch adapter under horovodrun: exact rank-derived values on averaging steps."""
import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
RANKS = np.arange(SIZE, dtype=np.float64)
GRADS = -(RANKS + 1)
GRAD = float(GRADS[RANK])


def gather(t):
    """Every rank's copy of tensor ``t``: shape (SIZE, *t.shape)."""
    return hvd.allgather(t.detach().reshape(1, -1).clone(), name="test.gather").numpy()


def all_identical(t):
    g = gather(t)
    return bool((g == g[0]).all())


def constant_grad_step(opt, params, grads):
    for p, g in zip(params, grads):
        p.grad = torch.full_like(p, g)
    opt.step()


def expected_localsgd(period, steps, lr=1.0):
    """Reference model of per-rank gradients g_r = -(r + 1) from w_r = r, averaged every period.

    Ranks drift apart by one more unit per step, so they differ after every local step.
    """
    w = RANKS.copy()
    history = []
    for step in range(1, steps + 1):
        w = w - lr * GRADS
        if step % period == 0:
            w = np.full(SIZE, w.mean())
        history.append(w.copy())
    return history


def test_localsgd_parameters_are_the_exact_mean_on_averaging_steps_and_differ_between():
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=hh.LocalSGD(period=3))
    seen = []
    for _ in range(7):
        constant_grad_step(opt, [p], [GRAD])
        seen.append(gather(p)[:, 0])
    for step, (got, want) in enumerate(zip(seen, expected_localsgd(3, 7)), start=1):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
        assert (len(set(got)) == 1) == (step % 3 == 0), f"step {step}: {got}"


def test_float_buffers_are_averaged_and_integer_buffers_left_alone():
    model = torch.nn.BatchNorm1d(2)
    with torch.no_grad():
        model.running_mean.fill_(float(RANK))
        model.num_batches_tracked.fill_(RANK)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                  named_parameters=model.named_parameters(),
                                  named_buffers=model.named_buffers(), strategy=hh.LocalSGD(period=2))
    constant_grad_step(opt, list(model.parameters()), [0.0, 0.0])
    before = model.running_mean.clone()
    constant_grad_step(opt, list(model.parameters()), [0.0, 0.0])
    assert before.tolist() == [float(RANK)] * 2
    assert model.running_mean.tolist() == [RANKS.mean()] * 2
    assert model.num_batches_tracked.item() == RANK


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def rank_batches(n, seed_offset=0):
    g = torch.Generator().manual_seed(100 + RANK + seed_offset)
    return [(torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)]


def train(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_sync_model_leaves_bit_identical_parameters():
    model = make_model(seed=RANK)                  # different start on every rank
    opt = hh.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                  named_parameters=model.named_parameters(), strategy=hh.LocalSGD(period=100))
    train(model, opt, rank_batches(4))
    differed = not all_identical(model[0].weight)
    opt.sync_model()
    identical = [all_identical(p) for p in model.parameters()]
    assert differed and all(identical)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt.optimizer, torch.optim.Adam)


@pytest.mark.parametrize("strategy", [hh.LocalSGD(period=2), hh.Synchronous()], ids=repr)
def test_ranks_with_different_numbers_of_batches_end_identical(strategy):
    model = make_model()
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), strategy=strategy)
    train(model, opt, rank_batches(3 + 4 * RANK))   # 3, 7, 11, 15 batches
    opt.sync_model()
    assert all(all_identical(p) for p in model.parameters())
    assert opt.strategy.step == 3 + 4 * RANK


def test_resume_from_state_dict_keeps_the_averaging_phase():
    p = torch.nn.Parameter(torch.full((1,), float(RANK)))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=hh.LocalSGD(period=4))
    for _ in range(5):
        constant_grad_step(opt, [p], [GRAD])
    state = opt.state_dict()
    resumed = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                      strategy=hh.LocalSGD(period=4))
    resumed.load_state_dict(state)
    seen = []
    for _ in range(4):                                # steps 6..9: averaging at step 8 only
        constant_grad_step(resumed, [p], [GRAD])
        seen.append(gather(p)[:, 0])
    expected = expected_localsgd(4, 9)[5:]
    for got, want in zip(seen, expected):
        np.testing.assert_array_equal(got, want)
    assert [len(set(g)) == 1 for g in seen] == [False, False, True, False]
    assert state["param_groups"][0]["horovod_hetero"]["strategy"]["step"] == 5


def test_one_fused_collective_per_averaging_step(monkeypatch):
    calls = []
    original = hvd.grouped_allreduce_async_

    def spy(tensors, *args, **kwargs):
        calls.append((len(tensors), kwargs.get("name")))
        return original(tensors, *args, **kwargs)

    monkeypatch.setattr(hvd, "grouped_allreduce_async_", spy)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(),
                                  named_buffers=model.named_buffers(), strategy=hh.LocalSGD(period=2))
    train(model, opt, [(torch.randn(6, 4), torch.randint(0, 4, (6,))) for _ in range(4)])
    # one flat tensor (4 parameters + 2 float buffers, in name order) + the control vector, once per
    # averaging step (2 and 4), named in the session the first step's broadcast gave every rank
    session = opt._hh.collectives.session
    assert len(session) == 9 and calls == [(2, f"horovod_hetero.average{session}")] * 2
    assert hvd.allgather_object(session, name="test.session") == [session] * hvd.size()
    names = sorted(dict(model.named_parameters())) + ["1.running_mean", "1.running_var"]
    flat = opt._hh.model.tensors()[0]
    offset = 0
    for name in names:                   # every tensor at its offset in the name order, no copy
        tensor = dict(model.named_parameters(), **dict(model.named_buffers()))[name]
        assert tensor.data_ptr() == flat.data_ptr() + offset * flat.element_size(), name
        offset += tensor.numel()
    assert offset == flat.numel()


@pytest.mark.parametrize("groups", [None, 1])
def test_a_failed_gradient_enqueue_in_backward_is_a_lost_rank(monkeypatch, groups):
    """Horovod's gradient hooks enqueue during loss.backward(), before step(): a collective that fails
    there (Horovod shut down by a dead rank) raises RankLostError, as it would in step()."""
    import horovod.torch.optimizer as hvd_optimizer
    from horovod.common.exceptions import HorovodInternalError
    from horovod_hetero.errors import RankLostError

    def shut_down(*args, **kwargs):
        raise HorovodInternalError("Horovod has been shut down")

    model = torch.nn.Linear(3, 2)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), groups=groups)
    monkeypatch.setattr(hvd_optimizer, "allreduce_async_", shut_down)
    monkeypatch.setattr(hvd_optimizer, "grouped_allreduce_async_", shut_down)
    with pytest.raises(RankLostError, match=r"^the gradient allreduce of step 1 \(round 0, step 1\) failed on "
                                            rf"rank {RANK}: .*Cause: HorovodInternalError: Horovod has been shut"):
        model(torch.ones(1, 3)).sum().backward()


@pytest.mark.parametrize("groups", [None, 1])
def test_the_gradient_allreduces_are_polled_before_horovods_busy_wait(monkeypatch, groups):
    """Horovod's ``synchronize`` waits in a loop of ``sched_yield`` calls that takes the GIL back each
    turn; where ranks outnumber cores the waiting ranks take the cores the others need. Under Gloo as
    under MPI, step() polls each gradient allreduce until it is done, and only then lets Horovod
    collect it: every handle Horovod synchronizes was polled done first."""
    import horovod.torch.optimizer as hvd_optimizer
    polled, collected = set(), []
    poll, collect = hvd.poll, hvd_optimizer.synchronize

    def spy_poll(handle):
        done = poll(handle)
        if done:
            polled.add(handle)
        return done

    def spy_collect(handle):
        collected.append(handle in polled)
        return collect(handle)

    monkeypatch.setattr(hvd, "poll", spy_poll)
    monkeypatch.setattr(hvd_optimizer, "synchronize", spy_collect)
    model = torch.nn.Linear(3, 2)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), groups=groups)
    train(model, opt, [(torch.ones(2, 3) * (RANK + 1), torch.tensor([0, 1])) for _ in range(3)])
    # 3 steps: the weight's and the bias's allreduce each, or the one group of both
    assert collected == [True] * (3 if groups else 6)


def test_telemetry_counts_local_steps_and_syncs():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = hh.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                  strategy=hh.LocalSGD(period=2))
    for _ in range(4):
        constant_grad_step(opt, [p], [1.0])
    recs = opt.telemetry.records
    assert [r["synced"] for r in recs] == [False, True, False, True]
    assert [r["local_steps"] for r in recs] == [1, 2, 1, 2]
    assert recs[1]["bytes_sent"] == int(2 * (SIZE - 1) * 8 / SIZE)   # 2 float32 values, ring estimate


def test_a_process_set_horovod_does_not_know_is_named_when_built():
    """A ProcessSet never registered (not given to hvd.init nor hvd.add_process_set) is refused by name,
    on every rank, before any collective; Horovod would fail later on its size (None)."""
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"process_set \[0, 1\] is not registered with Horovod: register it at "
                                         r"hvd.init\(process_sets=\[\.\.\.\]\)"):
        hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy=hh.LocalSGD(period=2),
                                process_set=hvd.ProcessSet([0, 1]))
