"""`make test`'s notebook stage (pytest -p tests.nbval_shared_kernel): one kernel for every notebook
the browser stage runs again.

nbval starts a kernel per notebook. Each new kernel imports torch and the package again (about
2 core-s), and its first run starts a multiprocessing forkserver that imports them once more for
its ranks (about 5.6 core-s, torch._dynamo included), then a pool of ranks per world size: about
9 core-s per notebook before its first cell computes anything, a sixth of the stage on 2 cores.

Here the notebooks that `tests/test_browser.py` also runs (`test_browser.NOTEBOOKS`, those with a
widget) share one kernel: before each, `%reset -f` empties the user namespace (so a name the
notebook never defines fails as in a fresh kernel), figures are closed, and the imported modules
and warm rank pools are kept. What a shared kernel cannot show, a notebook that works only
because an earlier one imported or configured something, the browser stage shows: it runs each
of those notebooks (their learner editions) in a fresh kernel of its own. A notebook the browser
does not run (no widget) gets a fresh kernel here, as nbval gives it. A kernel nbval stops (a
cell past its time limit) is not reused. `make test-notebooks` is plain nbval: every notebook in
a fresh kernel.
"""
from __future__ import annotations

from pathlib import Path

import nbval.plugin

from tests.test_browser import NOTEBOOKS as RUN_FRESH_BY_THE_BROWSER

# `%reset -f`, less its one difference from a fresh kernel: it also drops __main__'s dunders
# (`__spec__`, `__loader__`, ...), which multiprocessing reads to start a rank.
RESET = """\
def _zeroedu_reset(ip):
    keep = {k: v for k, v in ip.user_ns.items() if k.startswith("__") and k.endswith("__")}
    ip.reset(new_session=False)
    ip.user_ns.update(keep)
    import matplotlib.pyplot as plt
    plt.close("all")
_zeroedu_reset(get_ipython())
"""
RESET_TIMEOUT_S = 60

_shared = None  # the kernel the notebooks in RUN_FRESH_BY_THE_BROWSER share
_setup, _teardown = nbval.plugin.IPyNbFile.setup, nbval.plugin.IPyNbFile.teardown


def _shares(nb_file) -> bool:
    return Path(str(nb_file.fspath)).name in RUN_FRESH_BY_THE_BROWSER


def setup(self) -> None:
    global _shared
    if not _shares(self):
        return _setup(self)
    if _shared is not None and _shared.is_alive():
        msg_id = _shared.execute_cell_input(RESET, allow_stdin=False)
        _shared.await_reply(msg_id, timeout=RESET_TIMEOUT_S)
        _shared.await_idle(msg_id, RESET_TIMEOUT_S)
        self.kernel = _shared
        self.setup_sanitize_files()
        return None
    _setup(self)
    _shared = self.kernel
    return None


def teardown(self) -> None:
    if self.kernel is not None and self.kernel is _shared and self.kernel.is_alive():
        return  # kept for the next notebook that shares it
    _teardown(self)


def pytest_configure(config) -> None:
    nbval.plugin.IPyNbFile.setup, nbval.plugin.IPyNbFile.teardown = setup, teardown


def pytest_unconfigure(config) -> None:
    if _shared is not None and _shared.is_alive():
        _shared.stop()
