"""Horovod's ``examples/pytorch/pytorch_mnist.py`` as a user changes it by the README: the optimizer line
(``named_buffers`` beside it), ``hh.DistributedSampler`` in place of torch's (bound to the optimizer by
itself) and ``sync_model()`` at each epoch's end; digits for MNIST and a BatchNorm layer in the net.
Its three training paths: plain steps, gradient clipping as Horovod documents it (``synchronize()``,
clip, ``with skip_synchronize(): step()``) and the mixed-precision path (``GradScaler`` on the CPU,
``autocast`` in bfloat16). Exact expectations: every sample once per epoch over the ranks, the
sampler bound to the optimizer, the whole ``state_dict()`` (BatchNorm's statistics and its integer
``num_batches_tracked``) and the averaged metrics identical on every rank after each epoch."""
import pytest
import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job
from horovod_hetero_lab.data import digits

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
pytestmark = pytest.mark.skipif(SIZE != 4, reason="written for 4 ranks")
EPOCHS, BATCH = 2, 32
STRATEGIES = {"sync": hh.Synchronous, "esync": hh.ESync, "localsgd": lambda: hh.LocalSGD(period=4),
              "elasticbsp": hh.ElasticBSP, "localsgd2": lambda: hh.LocalSGD(period=2)}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.bn(self.fc1(x)))), dim=1)


def script(strategy, path):
    """The example's main(): {"indices": [per epoch, this rank's sample indices], "states": [per epoch, the
    state_dict], "metrics": [per epoch, (test loss, accuracy)], "bound": the sampler's optimizer is ours}."""
    torch.manual_seed(42)
    x, y, x_test, y_test = (torch.from_numpy(a) for a in digits())
    train_dataset = torch.utils.data.TensorDataset(x, y, torch.arange(len(x)))       # + each sample's index
    train_sampler = hh.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank(),
                                          loader_batch_size=BATCH)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=BATCH, sampler=train_sampler)
    test_dataset = torch.utils.data.TensorDataset(x_test, y_test)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(),
                                                                   rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=100, sampler=test_sampler)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hh.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        named_buffers=model.named_buffers(), compression=hvd.Compression.none,
                                        op=hvd.Average, gradient_predivide_factor=1.0,
                                        strategy=STRATEGIES[strategy](), slowdown="1,1,1,3")
    scaler = torch.amp.GradScaler("cpu") if path == "amp" else None

    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        seen = []
        for data, target, index in train_loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
                loss = F.nll_loss(model(data), target)
            if scaler is not None:                       # the example's train_mixed_precision
                scaler.scale(loss).backward()
                optimizer.synchronize()
                scaler.unscale_(optimizer)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
            elif path == "clip":                         # Horovod's documented clipping
                loss.backward()
                optimizer.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                loss.backward()
                optimizer.step()
            seen += index.tolist()
        optimizer.sync_model()
        return seen

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def test():
        model.eval()
        test_loss = test_accuracy = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_accuracy += output.argmax(1).eq(target).float().sum().item()
        return (metric_average(test_loss / len(test_sampler), "avg_loss"),
                metric_average(test_accuracy / len(test_sampler), "avg_accuracy"))

    out = {"indices": [], "states": [], "metrics": []}
    for epoch in range(1, EPOCHS + 1):
        out["indices"].append(train_epoch(epoch))
        out["states"].append({k: v.tolist() for k, v in model.state_dict().items()})
        out["metrics"].append(test())
    out["bound"] = train_sampler.optimizer is optimizer
    return out, len(x)


@pytest.mark.parametrize("strategy,path", [("esync", "clip"), ("localsgd", "amp"), ("elasticbsp", "plain"),
                                           ("sync", "clip"), ("sync", "amp")])
def test_horovods_example_changed_as_the_readme_says(strategy, path):
    mine, n = script(strategy, path)
    ranks = hvd.allgather_object(mine, name=f"example.{strategy}.{path}")
    assert all(r["bound"] for r in ranks)
    for epoch in range(EPOCHS):
        drawn = sorted(i for r in ranks for i in r["indices"][epoch])
        assert drawn == list(range(n)), f"epoch {epoch + 1}: not every sample once"
        states = [r["states"][epoch] for r in ranks]
        assert all(s == states[0] for s in states), f"epoch {epoch + 1}: state_dicts differ between ranks"
        assert all(r["metrics"][epoch] == ranks[0]["metrics"][epoch] for r in ranks)
    counted = ranks[0]["states"][-1]["bn.num_batches_tracked"]
    assert counted >= len(ranks[0]["indices"][0]) // BATCH           # rank 0's count after two epochs' steps
    assert ranks[0]["metrics"][-1][1] > 0.5                           # it learned something


def test_a_first_epoch_is_split_again_by_speed_once_every_rank_is_measured(monkeypatch):
    """The first epoch begins split evenly (no speed known); LocalSGD(period=2) has measured every rank by
    its second round (the first holds the start-up), at the 4th step, when each has drawn 4 of its 11 or
    more batches, and what is left is split by speed: rank 3, its steps padded to 3x the others', ends the
    epoch with the fewest samples, the others with whole batches, every sample once."""
    monkeypatch.setenv("HOROVOD_HETERO_BASE_STEP_S", "0.1")       # padded steps: the speeds are the factors
    mine, n = script("localsgd2", "plain")
    ranks = hvd.allgather_object(mine, name="example.first_epoch")
    first = [len(r["indices"][0]) for r in ranks]
    assert sorted(i for r in ranks for i in r["indices"][0]) == list(range(n))
    assert first[3] < min(first[:3]) and all(count % BATCH == 0 for count in first[:3]), first
