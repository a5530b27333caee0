import copy
import json
import os
import sys
from dataclasses import replace

import pytest

# The repository root, so ranks (forked from a server that inherits this sys.path) can import
# `examples.*` and `tests.*` by name, as a user's own modules would be.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from zeroedu.runtime import cluster  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    cluster.shutdown_pools()


class SharedRuns:
    """Multi-rank training runs, each run once per test session and shared by every module.

    `runs(cfg)` returns the report of `train.run(cfg)`; the same resolved configuration asked for
    by two modules starts ranks once. Every run returns its parameters (a superset of the report
    without them), so asking with or without `return_params` is the same run. Each caller gets
    its own deep copy: a test that edits a report cannot change what another test reads.
    """

    def __init__(self):
        self._reports: dict[str, dict] = {}
        self.started = 0  # runs that really started ranks (the rest were served from the cache)

    def __call__(self, cfg) -> dict:
        from zeroedu.train import run
        from zeroedu.train.config import config_to_dict

        cfg = replace(cfg.resolved(), return_params=True)
        key = json.dumps(config_to_dict(cfg), sort_keys=True, default=repr)
        if key not in self._reports:
            self._reports[key] = run(cfg)
            self.started += 1
        return copy.deepcopy(self._reports[key])


_SHARED_RUNS = SharedRuns()


@pytest.fixture(scope="session")
def runs() -> SharedRuns:
    """The session's cache of multi-rank runs (see `SharedRuns`); new multi-rank tests use it."""
    return _SHARED_RUNS


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
