"""Train an MLP on scikit-learn's digits (or another ``--task``) with horovod-hetero (PyTorch).

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy localsgd --period 8
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy wagma --period 8
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy elasticbsp

Ranks may stop at different steps (a wall-clock budget, or unequal data): each calls
``opt.sync_model()`` at the end, which keeps joining the others' averaging rounds until all are
done, so every rank ends with the same model.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.data import TASKS, score, task_data
from horovod_hetero.examples import Curve, add_run_arguments, add_strategy_arguments, build_strategy


def build_model(task, features):
    """The task's model (``Task.model``): an MLP, a small CNN on the 8x8 images, or a linear map."""
    if task.model == "cnn":
        return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 16, 3, padding=1),
                                   torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10))
    if task.model == "linear":
        return torch.nn.Linear(features, 1, bias=False)
    return torch.nn.Sequential(torch.nn.Linear(features, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def loss_fn(task, output, target):
    return F.mse_loss(output.squeeze(1), target) if task.loss == "mse" else F.cross_entropy(output, target)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)
    add_run_arguments(p)
    p.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    args = p.parse_args()
    task = TASKS[args.task]

    if args.strategy == "wagma":         # WAGMA's group process sets are registered at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    else:
        hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x, y, x_test, y_test = (torch.from_numpy(a) for a in task_data(task, hvd.rank(), hvd.size(), args.seed, args.skew))
    model = build_model(task, x.shape[1])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hh.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  named_buffers=model.named_buffers(),
                                  strategy=build_strategy(args))

    def evaluate():
        with torch.no_grad():
            return score(task, model(x_test).numpy(), y_test.numpy())

    curve = Curve(args.curve if hvd.rank() == 0 else None, args.eval_interval, evaluate, task.metric)
    hvd.barrier()                        # the time budget starts together on every rank (start-up differs by seconds)
    start = last_report = time.perf_counter()
    curve.begin()
    generator = torch.Generator().manual_seed(args.seed * 1000 + hvd.rank())
    steps, samples, out_of_time = 0, 0, False
    for epoch in range(args.epochs):
        for idx in torch.randperm(len(y), generator=generator).split(args.batch_size):
            loss = loss_fn(task, model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.telemetry.annotate(loss=loss.item(), samples=len(idx))
            opt.step()
            steps += 1
            samples += len(idx)
            curve.after_step(steps, opt.strategy.averages_gradients or opt.telemetry.records[-1]["synced"])
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
    curve.final(steps)

    quality = evaluate()
    samples = hvd.allreduce(torch.tensor(float(samples)), op=hvd.Sum, name="samples").item()
    if hvd.rank() == 0:
        result = {"strategy": repr(opt.strategy), "task": task.name, task.metric: quality, "steps_rank0": steps,
                  "samples": samples, "wall_s": wall, "samples_per_s": samples / wall, "eval_s": curve.eval_s}
        print(json.dumps(result), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)
    opt.telemetry.close()


if __name__ == "__main__":
    main()
