import os
import sys

import pytest

# The repository root, so ranks (forked from a server that inherits this sys.path) can import
# `examples.*` and `tests.*` by name, as a user's own modules would be.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from zeroedu.runtime import cluster  # noqa: E402

from .shared_runs import RUNS, SharedRuns  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    cluster.shutdown_pools()


@pytest.fixture(scope="session")
def runs() -> SharedRuns:
    """The session's cache of multi-rank runs (tests/shared_runs.py); new multi-rank tests use
    it, as a fixture or, from a module-level helper, as `shared_runs.RUNS`."""
    return RUNS


@pytest.fixture(autouse=True)
def _fast_tests_start_no_ranks(request, monkeypatch):
    """A test marked `fast` (the `make test-fast` tier) must not start or use ranks: that is what
    keeps the tier under two minutes. Starting a pool or running a job on one fails it."""
    if request.node.get_closest_marker("fast") is None:
        return

    def refuse(*_a, **_k):
        raise AssertionError(f"{request.node.nodeid} is marked fast but starts ranks; "
                             "mark it otherwise or make it single-rank in this process")

    monkeypatch.setattr(cluster.Pool, "_start", refuse)
    monkeypatch.setattr(cluster.Pool, "run", refuse)


def _kept_log_dirs() -> set[str]:
    import glob
    import tempfile

    root = tempfile.gettempdir()
    return {os.path.dirname(p) for p in glob.glob(os.path.join(root, cluster.LOG_PREFIX + "*", cluster.KEPT_FILE))}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A run a test fails on purpose keeps its ranks' logs (named in the error, for a reader to
    open); once the test has passed nobody will, so they are removed. A failing test's stay."""
    import shutil

    before = _kept_log_dirs()
    outcome = yield
    if outcome.excinfo is None:
        for d in _kept_log_dirs() - before:
            shutil.rmtree(d, ignore_errors=True)
