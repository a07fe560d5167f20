"""Shared fixtures: an artifact cache private to the test session; no progress lines (tests
read stderr; tests/test_progress.py turns them on)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_artifact_cache(tmp_path_factory):
    """Every test builds artifacts into one cache of its own, never the user's."""
    if "ONNXPLAN_CACHE" not in os.environ:
        os.environ["ONNXPLAN_CACHE"] = str(tmp_path_factory.mktemp("onnxplan-cache"))
    yield


@pytest.fixture(scope="session", autouse=True)
def _fixed_swap_bandwidth():
    """Swap transfers priced at a fixed store bandwidth (onnxplan.swap.pricing), not one measured
    on the test machine's disk: plans do not depend on its traffic. tests/test_swap_pricing.py
    measures the store itself."""
    os.environ.setdefault("ONNXPLAN_SWAP_BANDWIDTH", "2.5e8")
    yield


@pytest.fixture(scope="session", autouse=True)
def _thread_policy():
    """Every pool sized by onnxplan.threads from the start ($ONNXPLAN_THREADS runs the suite at
    that count: `ONNXPLAN_THREADS=1 python -m pytest tests/test_kernels_*.py`)."""
    from onnxplan import threads

    threads.use_threads(None)
    yield


@pytest.fixture(scope="session", autouse=True)
def _no_progress_lines():
    os.environ.setdefault("ONNXPLAN_PROGRESS", "off")
    yield


@pytest.fixture(autouse=True)
def _settings_from_the_environment():
    """Each test starts with the settings the environment gives (onnxplan.settings): one that
    sets them (settings.use, or a variable and settings.reload) leaves no trace."""
    from onnxplan import settings

    settings.use(None)
    yield
    settings.use(None)


@pytest.fixture(autouse=True)
def _own_random_stream(request):
    """Every test draws its data from a stream seeded by its own id (tests/kernel_harness.py's RNG,
    restarted in place), so its data do not depend on which tests ran before it."""
    harness = sys.modules.get("tests.kernel_harness")
    if harness is not None:
        harness.reseed(request.node.nodeid)
    yield


def pytest_addoption(parser):
    parser.addoption("--test-order", default="file", metavar="ORDER",
                     help="file (default), reverse, or shuffle:SEED: run the collected tests in that order "
                          "(a test that passes only in file order depends on another test's state)")


def pytest_collection_modifyitems(config, items):
    order = config.getoption("--test-order")
    if order == "reverse":
        items.reverse()
    elif order.startswith("shuffle:") and order[len("shuffle:"):].isdigit():
        import random

        random.Random(int(order[len("shuffle:"):])).shuffle(items)
    elif order != "file":
        raise pytest.UsageError(f"--test-order: expected file, reverse or shuffle:SEED, got {order!r}")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def n_threads(request, monkeypatch):
    """1 or 2 compute threads, kernel pieces from 64 elements (at 2, every case of two rows or more
    is cut): the fused loops' tests run every case at both."""
    from onnxplan import threads
    from onnxplan.kernels import parallel

    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    before = threads.current().threads
    threads.use_threads(request.param)
    yield request.param
    threads.use_threads(before)


@pytest.fixture
def split(monkeypatch):
    """Pieces of at least 64 elements (onnxplan.kernels.parallel), 3 compute threads: small arrays
    and products are split (tests/test_parallel.py, tests/test_kernels_gemm_pool.py). The splits'
    score starts afresh: one the tests before left losing would run every piece on the caller."""
    from onnxplan import threads
    from onnxplan.kernels import parallel

    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    monkeypatch.setattr(parallel, "outcomes", parallel.Outcomes())
    before = threads.current().threads
    threads.use_threads(3)
    yield
    threads.use_threads(before)
