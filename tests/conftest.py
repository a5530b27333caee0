import os
import sys

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
