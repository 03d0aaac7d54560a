"""A 2-rank training run that uses only the installed library (no checkout, no lab): a linear model on
fixed random data, LocalSGD over an ``hh.DistributedSampler``, two epochs each closed by ``sync_model()``;
rank 0 prints one JSON line after checking that every rank holds the same parameters.

    horovodrun -np 2 -H localhost:2 --gloo python installed_train.py
"""
import json

import torch

import horovod.torch as hvd
import horovod_hetero
import horovod_hetero.torch as hh

hvd.init()
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.arange(8.0) + 1.0
dataset = torch.utils.data.TensorDataset(x, y)
model = torch.nn.Linear(8, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
sampler = hh.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)
opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                              named_parameters=model.named_parameters(), strategy=hh.LocalSGD(period=4))
for epoch in range(2):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
        loss.backward()
        opt.step()
    opt.sync_model()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0))
assert torch.equal(gathered[0], gathered[1]), "the ranks' models differ after sync_model()"
if hvd.rank() == 0:
    print(json.dumps({"library": horovod_hetero.__file__, "version": horovod_hetero.__version__,
                      "size": hvd.size(), "loss": float(loss), "rounds": opt.state_dict()["param_groups"][0]
                      ["horovod_hetero"]["rounds"]}))
