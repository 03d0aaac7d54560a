"""Synchronous() against hvd.DistributedOptimizer, bit for bit.

Run with HOROVOD_FUSION_THRESHOLD=0: with tensor fusion on, which tensors Horovod fuses depends
on timing and changes Gloo's summation order, so even two runs of hvd.DistributedOptimizer on
the same data differ in the last bits (the A/A check below shows it for the reference itself).
"""
import os

os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"   # before hvd.init(); make test runs this file in a job of its own

import torch  # noqa: E402

import horovod.torch as hvd  # noqa: E402
import horovod_hetero.torch as hh  # noqa: E402
from test_torch import make_model, rank_batches, train  # noqa: E402


def reference_run(batches):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    train(model, opt, batches)
    return model


def test_synchronous_matches_horovod_distributed_optimizer_bit_for_bit():
    batches = rank_batches(6)
    reference, again, ours = reference_run(batches), reference_run(batches), make_model()
    opt = hh.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=ours.named_parameters(), strategy=hh.Synchronous())
    train(ours, opt, batches)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt.optimizer, torch.optim.SGD)
    for a, b, c in zip(reference.parameters(), again.parameters(), ours.parameters()):
        assert torch.equal(a, b), "the reference itself is not reproducible (is fusion on?)"
        assert torch.equal(a, c)
    assert reference[0].weight.sum().item() != make_model()[0].weight.sum().item()
