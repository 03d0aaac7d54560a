"""Train an MLP on scikit-learn's digits with horovod-hetero (PyTorch).

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy localsgd --period 8
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy wagma --period 8
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy elasticbsp

Ranks may stop at different steps (a wall-clock budget, or unequal data): each calls
``opt.sync_model()`` at the end, which keeps joining the others' averaging rounds until all are
done, so every rank ends with the same model.
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.data import digits
from horovod_hetero.examples import add_strategy_arguments, build_strategy


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    args = p.parse_args()

    if args.strategy == "wagma":         # WAGMA's group process sets are registered at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    else:
        hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y, x_test, y_test = (torch.from_numpy(a) for a in digits(hvd.rank(), hvd.size()))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  named_buffers=model.named_buffers(),
                                  strategy=build_strategy(args))

    hvd.barrier()                        # the time budget starts together on every rank (start-up differs by seconds)
    start = last_report = time.perf_counter()
    generator = torch.Generator().manual_seed(hvd.rank())
    steps, samples, out_of_time = 0, 0, False
    for epoch in range(args.epochs):
        for idx in torch.randperm(len(y), generator=generator).split(args.batch_size):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.telemetry.annotate(loss=loss.item(), samples=len(idx))
            opt.step()
            steps += 1
            samples += len(idx)
            now = time.perf_counter()
            if hvd.rank() == 0 and now - last_report >= args.progress:
                print(f"  [{now - start:5.1f} s] epoch {epoch} step {steps} loss {loss.item():.3f}", flush=True)
                last_report = now
            if args.time_budget is not None and now - start >= args.time_budget:
                out_of_time = True
                break
        if out_of_time:
            break
    opt.sync_model()                     # every rank, whatever step it stopped at
    wall = time.perf_counter() - start

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    samples = hvd.allreduce(torch.tensor(float(samples)), op=hvd.Sum, name="samples").item()
    if hvd.rank() == 0:
        result = {"strategy": repr(opt.strategy), "accuracy": accuracy, "steps_rank0": steps,
                  "samples": samples, "wall_s": wall, "samples_per_s": samples / wall}
        print(json.dumps(result), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)
    opt.telemetry.close()


if __name__ == "__main__":
    main()
