"""The multi-rank runs several test modules need, each started once per test session.

`RUNS(cfg)` (or the `runs` fixture, tests/conftest.py) is the one cache: two modules that ask
for the same resolved configuration share one run. A new multi-rank test asks here rather than
keeping a cache of its own (budget: tests/README.md).
"""
from __future__ import annotations

import copy
import json
from dataclasses import replace


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


RUNS = SharedRuns()
