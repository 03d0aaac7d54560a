"""A training script shaped like Horovod's PyTorch MNIST example (``examples/pytorch/pytorch_mnist.py``:
epochs over a sampler, metrics averaged with ``hvd.allreduce``, a checkpoint on rank 0), on scikit-learn's
8x8 digits with a small MLP, CPU only. horovod-hetero's changes are marked ``# hh``: the wrapper line, the
sampler, ``sync_model()`` per epoch. Horovod's own script, unchanged, is in ``lab/horovod_examples/``;
the README shows the diff that ports it.

Needs horovod-hetero's lab beside the library (the dataset and the ``--strategy`` options): from a
checkout, ``pip install -e lab`` (``make`` does it).

    horovodrun -np 4 -H localhost:4 --gloo python examples/torch_mnist.py --strategy esync

As in Horovod's example: every epoch trains on a shard of the data, ``test()`` averages its metrics
with ``hvd.allreduce``; as in Horovod's ImageNet example, rank 0 saves a checkpoint after every
epoch, and a restarted job resumes from the newest one (rank 0 loads it, then
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``). ``hh.DistributedSampler``
gives every rank a share of each epoch proportional to its speed, and ``opt.sync_model()`` at the
epoch's end brings every rank to the same round, so the split agrees and ``test()``'s collectives
meet. Pattern for "train for N samples or T seconds" instead of epochs: break out of the loop
when your count or clock says so, then call ``opt.sync_model()`` (ranks may stop at different steps).
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import torch.utils.data

import horovod.torch as hvd
import horovod_hetero.torch as hh                                            # hh
from horovod_hetero_lab.data import digits
from horovod_hetero_lab.harness import add_strategy_arguments, aggregation, build_strategy  # hh


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)                                                 # hh
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--test-batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--use-adasum", action="store_true", default=False)
    p.add_argument("--sampler", choices=["hh", "torch"], default="hh",
                   help="hh.DistributedSampler (speed-proportional shares) or torch's (even shares)")
    p.add_argument("--checkpoint-dir", default=None, help="rank 0 saves every epoch here; a new run resumes")
    p.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if not hvd.is_initialized():
        # WAGMA's group process sets are registered at init
        hvd.init(process_sets=hh.wagma_process_sets(args.group_size) if args.strategy == "wagma" else None)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y, x_test, y_test = (torch.from_numpy(a) for a in digits())
    train_dataset = torch.utils.data.TensorDataset(x, y)
    train_sampler: hh.DistributedSampler | torch.utils.data.distributed.DistributedSampler  # hh: either
    if args.sampler == "hh":                                                  # hh
        train_sampler = hh.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    else:
        train_sampler = torch.utils.data.distributed.DistributedSampler(
            train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_dataset = torch.utils.data.TensorDataset(x_test, y_test)
    test_sampler: torch.utils.data.distributed.DistributedSampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    lr_scaler = hvd.size() if not args.use_adasum else 1
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
    optimizer = hh.DistributedOptimizer(                                      # hh: was hvd.DistributedOptimizer
        sgd, named_parameters=model.named_parameters(), named_buffers=model.named_buffers(),
        op=hvd.Adasum if args.use_adasum else hvd.Average, strategy=build_strategy(args),
        sampler=train_sampler if isinstance(train_sampler, hh.DistributedSampler) else None,
        aggregate=aggregation(args))

    # resume from the newest checkpoint: rank 0 loads it, everyone takes rank 0's state
    resume_from_epoch = 0
    if args.checkpoint_dir and hvd.rank() == 0:
        done = [int(f.split(".")[0]) for f in os.listdir(args.checkpoint_dir) if f.endswith(".pt")]
        resume_from_epoch = max(done, default=0)
    resume_from_epoch = int(hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch"))
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(os.path.join(args.checkpoint_dir, f"{resume_from_epoch}.pt"))
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def train(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        batches = len(train_loader)                                           # this epoch's share
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.report_loss(loss)                                       # hh: for ADSP's search (optional)
            optimizer.step()
        optimizer.sync_model()                                                # hh: every rank at the same round
        return batches

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def test():
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_accuracy += output.argmax(1).eq(target).float().sum().item()
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        return metric_average(test_loss, "avg_loss"), metric_average(test_accuracy, "avg_accuracy")

    hvd.barrier()
    epoch_s, batches, metrics = [], [], None
    for epoch in range(resume_from_epoch + 1, args.epochs + 1):
        t0 = time.perf_counter()
        batches.append(train(epoch))
        epoch_s.append(time.perf_counter() - t0)
        metrics = test()
        if args.checkpoint_dir and hvd.rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(args.checkpoint_dir, f"{epoch}.pt"))
    result = {"strategy": repr(optimizer.strategy), "resumed_from": resume_from_epoch, "epoch_s": epoch_s,
              "batches": batches, "test_loss_accuracy": metrics, "model": [v.tolist() for v in model.state_dict().values()],
              "strategy_step": optimizer.strategy.step}
    if args.result and hvd.rank() == 0:
        with open(args.result, "w") as f:
            json.dump({k: v for k, v in result.items() if k != "model"}, f)
    optimizer.telemetry.close()
    return result


if __name__ == "__main__":
    main()
