"""Parallel tests run under ``horovodrun -np 4 --gloo``: every rank runs every test in order.

Tests do all their collectives first and assert afterwards, so a failing rank does not leave
the others waiting in a collective; pytest-timeout bounds anything that still hangs.
"""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    if "HOROVOD_RANK" not in os.environ:
        skip = pytest.mark.skip(reason="parallel test: run under horovodrun -np 4 --gloo (make test)")
        for item in items:
            item.add_marker(skip)
