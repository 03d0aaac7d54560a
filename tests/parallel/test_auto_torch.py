"""``hh.Auto`` under horovodrun (torch): with a persistent straggler (slowdown 1,1,1,4) it starts as
Synchronous, measures every step and decides at the sixth round (its first decision: four rounds after the
two start-up rounds), which holds the sixth step's statistics and comes at the seventh step (its allreduce
overlaps that step), so the model-averaging strategy it chose runs from the eighth, every rank at the same
round and step, and the models end
identical; the switch is in the telemetry and in ``state_dict()``; with equal ranks it keeps Synchronous;
where the training loss stops falling after the switch, the guard takes it back to Synchronous."""
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero.runtime.straggler import Slowdown

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def train(factors, steps, candidates=("sync", "esync", "elasticbsp", "localsgd"), loss_of=None, **options):
    """``steps`` steps under ``factors``; ``loss_of(opt, loss)``: the loss the rounds carry (else the batch's)."""
    model = model_of()
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
                                  strategy=hh.Auto(candidates=list(candidates), **options),
                                  slowdown=Slowdown(RANK, factors, base_step_s=0.02))
    g = torch.Generator().manual_seed(RANK)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.telemetry.annotate(loss=loss.item() if loss_of is None else loss_of(opt), samples=16)
        opt.step()
    opt.sync_model()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    switches = [(r["step"], r["switch"]) for r in opt.telemetry.records if "switch" in r]
    ran = [(r["step"], r["auto"]) for r in opt.telemetry.records]
    return hvd.allgather_object((flat, opt.strategy.switches, opt.strategy.current_name, switches,
                                 opt.state_dict()["param_groups"][0]["horovod_hetero"]["strategy"]["current"], ran),
                                name=f"test.auto.{factors}")


def test_a_persistent_straggler_makes_auto_leave_synchronous_at_one_round_on_every_rank():
    everyone = train("1,1,1,4", 80)
    flats, decided, current, recorded, saved, ran = zip(*everyone)
    assert all(f == flats[0] for f in flats)                                   # identical models at the end
    assert all(d == decided[0] for d in decided) and decided[0]               # the same switches everywhere
    first = decided[0][0]
    assert first["from"] == "sync" and first["to"] in ("esync", "elasticbsp") and first["step"] == 6, first
    assert first["round"] == 6, first                                           # a round of statistics a step
    assert "persistent" in first["why"] and len(set(current)) == 1 and current[0] != "sync"
    assert recorded[0][0] == (7, first) and saved[0] == current[0]             # in the telemetry and the state
    assert ran[0][6:8] == [(7, "sync"), (8, first["to"])], ran[0][:10]          # the round came at step 7


def test_equal_ranks_keep_synchronous_where_no_candidate_saves_them_time():
    """ESync and ElasticBSP average as often as Synchronous where every rank is as fast: nothing to gain.
    (LocalSGD would save collectives: with them costly enough, over the 2.09x that equal ranks ask of a
    model-averaging strategy, Auto may move there.)"""
    everyone = train("1,1,1,1", 60, ("sync", "esync", "elasticbsp"))
    flats, decided, current, _, _, _ = zip(*everyone)
    assert all(f == flats[0] for f in flats)
    assert set(current) == {"sync"} and decided[0] == [], decided[0]


def test_the_guard_takes_auto_back_where_the_loss_stops_falling_after_a_switch():
    """A loss that falls under Synchronous and stays flat after the switch (what the rounds carry): after
    ``settle_rounds`` rounds the guard goes back to Synchronous, every rank at the same round, and ESync is
    not tried again."""
    def loss_of(opt):
        auto = opt.strategy
        left = auto.switches[0]["step"] if auto.switches else None
        return 2.0 - 0.01 * (auto.step if left is None else left)

    everyone = train("1,1,1,4", 60, ("sync", "esync"), loss_of, trial_rounds=0)
    flats, decided, current, _, _, _ = zip(*everyone)
    assert all(f == flats[0] for f in flats) and all(d == decided[0] for d in decided)
    there, back = decided[0][:2]
    assert (there["from"], there["to"], there["step"]) == ("sync", "esync", 6), there
    assert (back["from"], back["to"]) == ("esync", "sync") and "the guard" in back["why"], back
    assert len(decided[0]) == 2 and set(current) == {"sync"}, decided[0]


def test_ranks_that_stop_at_different_steps_under_a_model_averaging_strategy_end_together():
    """Collectives that cost far more than a step (a 4M-parameter model, batches of 4: LocalSGD is predicted
    several times Synchronous's speed, over the 2.09x equal ranks ask; six rounds steady the noise estimate): Auto leaves Synchronous for
    LocalSGD. Rank 0 stops right after one of LocalSGD's rounds, the others 6 steps later (past where a round of
    statistics would fall): rank 0 joins the others' rounds with its model in ``sync_model()``, no round of
    statistics stands in their way, and every rank ends with the same model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2000, 2000), torch.nn.Tanh(), torch.nn.Linear(2000, 3))
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
                                  strategy=hh.Auto(candidates=["sync", "localsgd"], min_rounds=6), timeout=30.0)
    g = torch.Generator().manual_seed(RANK)
    stop = None
    for step in range(1, 200):
        x, y = torch.randn(4, 2000, generator=g), torch.randint(0, 3, (4,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if stop is None and step >= 20 and opt.strategy.current_name == "localsgd" and opt.telemetry.records[-1]["synced"]:
            stop = step if RANK == 0 else step + 6          # the same round on every rank: LocalSGD steps together
        if step == stop:
            break
    opt.sync_model()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather_object((stop, opt.strategy.current_name, flat.sum().item(), flat[:1000].tolist()),
                                    name="test.auto.stops")
    stops, running, sums, heads = zip(*everyone)
    assert set(running) == {"localsgd"} and stops[1] == stops[0] + 6, (stops, running)
    assert len(set(sums)) == 1 and all(h == heads[0] for h in heads)
