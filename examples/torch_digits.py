"""Train any bench task with horovod-hetero (PyTorch): an MLP on scikit-learn's digits (the default), a CNN on
Fashion-MNIST, a character transformer on Shakespeare (``--task``, ``--split``).

The bench's training script: needs horovod-hetero's lab beside the library (datasets, options, results):
from a checkout, ``pip install -e lab`` (``make`` does it).

    horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py --strategy localsgd --period 8
    horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py --strategy wagma --period 8
    horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py --strategy elasticbsp \\
        --task fashion-cnn --split dirichlet:0.1 --aggregate normalized

``--stop-at QUALITY`` (with ``--curve``) ends training once rank 0's curve reaches it (the bench's
``--stop-at-target``). Ranks may stop at different steps (a wall-clock budget, the quality reached, or
unequal data): each calls
``opt.sync_model()`` at the end, which keeps joining the others' averaging rounds until all are
done, so every rank ends with the same model.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_hetero.torch as hh
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero_lab.data import TASKS, TEXT_WINDOW, class_accuracy, score, shakespeare, task_data
from horovod_hetero_lab.harness import (
    Curve, add_run_arguments, add_strategy_arguments, aggregation, build_strategy, curve_subset, write_result)


class CharTransformer(torch.nn.Module):
    """A small causal transformer over characters: embedding, 2 pre-norm layers of width 64, 4 heads."""

    def __init__(self, vocab, width=64, layers=2, heads=4, window=TEXT_WINDOW):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(window, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x):
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
        return self.head(self.body(self.embed(x) + self.position[:n], mask=causal, is_causal=True))


def build_model(task, features):
    """The task's model (``Task.model``)."""
    if task.model == "cnn":
        return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 16, 3, padding=1),
                                   torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10))
    if task.model == "fashion-cnn":
        return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 10))
    if task.model == "char-transformer":
        return CharTransformer(len(shakespeare()[1]))
    if task.model == "linear":
        return torch.nn.Linear(features, 1, bias=False)
    return torch.nn.Sequential(torch.nn.Linear(features, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def local_optimizer(task, model, lr):
    """The task's local optimizer (``Task.optimizer``): SGD with momentum 0.9, or Adam."""
    if task.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def loss_fn(task, output, target):
    if task.loss == "mse":
        return F.mse_loss(output.squeeze(1), target)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def evaluator(task, model, x_test, y_test, batch=1000):
    """``evaluate(weights) -> {metric: value, "classes": per-class accuracy}`` on ``x_test`` (``weights``:
    a ``state_dict`` snapshot, loaded into ``model``)."""
    def evaluate(weights=None):
        if weights is not None:
            model.load_state_dict(weights)
        with torch.no_grad():
            outputs = torch.cat([model(x_test[i:i + batch]) for i in range(0, len(x_test), batch)]).numpy()
        out = {task.metric: score(task, outputs, y_test.numpy())}
        if task.classes:
            out["classes"] = class_accuracy(outputs, y_test.numpy(), task.classes)
        return out
    return evaluate


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_strategy_arguments(p)
    add_run_arguments(p)
    p.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--stop-at", type=float, default=None,
                   help="end training once rank 0's curve reaches this quality (needs --curve; the ranks share "
                        "one file system: CURVE.stop tells them)")
    p.add_argument("--check-interval", type=float, default=None,
                   help="with --stop-at: seconds at least between two evaluations during training (default: "
                        "--eval-interval; the snapshots between them are evaluated after training)")
    args = p.parse_args()
    task = TASKS[args.task]
    if args.stop_at is not None and args.curve is None:
        p.error("--stop-at needs --curve (the curve's evaluations decide when the quality is reached)")
    if args.stop_at is not None and not (math.isfinite(args.stop_at) and args.stop_at > 0):
        p.error(f"--stop-at must be a quality > 0, got {args.stop_at!r}")
    if args.check_interval is not None and args.stop_at is None:
        p.error("--check-interval needs --stop-at (it spaces the evaluations that decide when to stop)")
    if args.check_interval is not None and not args.check_interval >= 0:
        p.error(f"--check-interval must be seconds >= 0, got {args.check_interval!r}")
    stop_file = None if args.stop_at is None else args.curve + ".stop"

    if args.strategy in ("wagma", "auto"):   # WAGMA's group process sets (Auto's candidate too), at init
        hvd.init(process_sets=hh.wagma_process_sets(group_size=args.group_size))
    else:
        hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    strategy = build_strategy(args)
    sampler = None
    if runner_for(strategy).plans_batches:               # Balanced: every rank draws its planned part of the whole training set
        x, y, x_test, y_test = (torch.from_numpy(a) for a in task_data(task, 0, 1, args.seed, args.skew, "iid"))
        sampler = hh.DistributedSampler(range(len(y)), batch_size=args.batch_size, seed=args.seed)
    else:
        x, y, x_test, y_test = (torch.from_numpy(a) for a in task_data(task, hvd.rank(), hvd.size(), args.seed,
                                                                       args.skew, args.split))
    model = build_model(task, x.shape[1])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hh.DistributedOptimizer(local_optimizer(task, model, args.lr or task.lr),
                                  named_parameters=model.named_parameters(),
                                  named_buffers=model.named_buffers(),
                                  strategy=strategy, sampler=sampler, aggregate=aggregation(args))

    def batches(epoch):
        """This rank's batches of an epoch: its own shard's, shuffled; with Balanced the sampler's."""
        if sampler is not None:
            sampler.set_epoch(epoch)
            return (torch.tensor(idx) for idx in sampler)
        return torch.randperm(len(y), generator=generator).split(args.batch_size)

    subset = torch.from_numpy(curve_subset(task, y_test.numpy()))
    snapshot = lambda: {k: v.detach().clone() for k, v in model.state_dict().items()}     # noqa: E731
    curve = Curve(args.curve if hvd.rank() == 0 else None, args.eval_interval, snapshot,
                  evaluator(task, model, x_test[subset], y_test[subset]), task.metric,
                  stop_at=None if stop_file is None else (args.stop_at, task.reached), stop_file=stop_file,
                  check_interval=args.check_interval)
    hvd.barrier()                        # the time budget starts together on every rank (start-up differs by seconds)
    start = last_report = time.perf_counter()
    curve.begin()
    generator = torch.Generator().manual_seed(args.seed * 1000 + hvd.rank())
    steps, samples, out_of_time = 0, 0, False
    for epoch in range(args.epochs):
        for idx in batches(epoch):
            loss = loss_fn(task, model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.telemetry.annotate(loss=loss.item(), samples=len(idx))
            opt.step()
            steps += 1
            samples += len(idx)
            curve.after_step(steps, opt.runner.steps_together or opt.telemetry.records[-1]["synced"])
            now = time.perf_counter()
            if hvd.rank() == 0 and now - last_report >= args.progress:
                print(f"  [{now - start:5.1f} s] epoch {epoch} step {steps} loss {loss.item():.3f}", flush=True)
                last_report = now
            if (args.time_budget is not None and curve.clock() >= args.time_budget) or curve.stop_requested():
                out_of_time = True
                break
        if out_of_time:
            break
    opt.sync_model()                     # every rank, whatever step it stopped at
    wall = curve.clock()                 # the curve's clock: its snapshots' (and evaluations') time left out
    curve.final(steps)

    samples = hvd.allreduce(torch.tensor(float(samples)), op=hvd.Sum, name="samples").item()
    opt.telemetry.close()
    if hvd.rank() == 0:
        torch.set_num_threads(2)         # training is over: evaluate with the cores the ranks shared
        curve.evaluate_all()             # the snapshots, in order; the model ends at its final weights
        final = evaluator(task, model, x_test, y_test)()
        result = {"strategy": repr(opt.strategy), "task": task.name, "split": args.split or task.split,
                  **{task.metric: final[task.metric]}, "steps_rank0": steps, "samples": samples, "wall_s": wall,
                  "samples_per_s": samples / wall, "eval_s": curve.eval_s}
        write_result(result, task, final, args.result)


if __name__ == "__main__":
    main()
