import pytest

from zeroedu.runtime import cluster


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    cluster.shutdown_pools()
