"""Parallel tests run under ``horovodrun -np 4 --gloo`` (some also under ``horovodrun --mpi`` and
``mpirun``: ``make test-mpi``): every rank runs every test in order.

Tests do all their collectives first and assert afterwards, so a failing rank does not leave
the others waiting in a collective; pytest-timeout bounds anything that still hangs.
"""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    # horovodrun --gloo exports HOROVOD_RANK; under MPI the launcher's own variables name the rank
    if not any(name in os.environ for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
        skip = pytest.mark.skip(reason="parallel test: run under horovodrun -np 4 --gloo (make test)")
        for item in items:
            item.add_marker(skip)
