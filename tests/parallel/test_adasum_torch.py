"""Adasum with ``Synchronous`` (torch): under MPI, ``op=hvd.Adasum`` gives Horovod's Adasum of the ranks'
updates, checked against the formula (Maleki et al., 2021) computed here; under Gloo it is refused when
the optimizer is built. Horovod's own Adasum tests (``test/parallel/test_adasum_pytorch.py``) check the
same two cases as ``orthogonal`` and ``parallel``: orthogonal updates add up, parallel ones average."""
import numpy as np
import pytest
import torch

import horovod.torch as hvd
import horovod_hetero.torch as hh
import job

job.init(hvd, hh)
RANK, SIZE = hvd.rank(), hvd.size()
N = 16
pytestmark = pytest.mark.skipif(SIZE not in (2, 4), reason="written for 2 or 4 ranks")


def adasum_pair(a, b):
    """Adasum of two vectors: each loses the part of it the other one already holds, by half."""
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def adasum(vectors):
    """Horovod's order on a power of two: neighbours first (0 with 1, 2 with 3), then the pairs."""
    while len(vectors) > 1:
        vectors = [adasum_pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def step_with(gradients):
    """One ``opt.step()`` of SGD (lr 1) from zero on a float64 vector whose gradient on rank r is
    ``gradients[r]``: the parameters after it."""
    w = torch.nn.Parameter(torch.zeros(N, dtype=torch.float64))
    opt = hh.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], op=hvd.Adasum)
    (w * torch.from_numpy(gradients[RANK])).sum().backward()
    opt.step()
    return w.detach().numpy()


@pytest.mark.skipif(not hvd.mpi_enabled(), reason="Adasum runs under MPI (the Gloo case is the test below)")
def test_adasum_of_the_ranks_updates_matches_the_formula():
    rng = np.random.default_rng(7)
    general = [rng.normal(size=N) for _ in range(SIZE)]
    orthogonal = list(np.linalg.qr(rng.normal(size=(N, SIZE)))[0].T)
    base = rng.normal(size=N)
    parallel = [scale * base for scale in (1.0, 2.0, 0.5, 3.0)[:SIZE]]
    results = [step_with(g) for g in (general, orthogonal, parallel)]
    np.testing.assert_allclose(results[0], -adasum(general), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[1], -np.sum(orthogonal, axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[2], -np.mean(parallel, axis=0), rtol=1e-12, atol=1e-12)
    assert not np.allclose(results[0], -np.mean(general, axis=0))     # neither a mean nor a sum
    assert not np.allclose(results[0], -np.sum(general, axis=0))


@pytest.mark.skipif(hvd.mpi_enabled(), reason="the refusal is Gloo's case")
def test_under_gloo_adasum_is_refused_when_the_optimizer_is_built():
    w = torch.nn.Parameter(torch.zeros(N))
    with pytest.raises(ValueError, match="op=hvd.Adasum needs Horovod's MPI controller"):
        hh.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), op=hvd.Adasum)
