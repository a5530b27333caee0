"""tests/nbval_shared_kernel.py, make test's notebook stage: two notebooks the browser stage also
runs share one kernel, the second starts with none of the first's names, and __main__ keeps what
multiprocessing needs to start ranks; a notebook the browser does not run gets a kernel of its own."""
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, *cells: tuple[str, str]) -> None:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    for i, (source, printed) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, execution_count=i)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)] if printed else []
        nb.cells.append(cell)
    nbformat.write(nb, str(path))


def test_the_browsers_notebooks_share_a_reset_kernel_and_the_others_get_their_own(tmp_path):
    from .test_browser import NOTEBOOKS

    first, second = NOTEBOOKS[0], NOTEBOOKS[1]
    other = "99_not_in_the_browser_stage.ipynb"
    assert other not in NOTEBOOKS
    pid = tmp_path / "pid"
    _notebook(tmp_path / first, (f"import os\nleft_behind = 1\nn = open({str(pid)!r}, 'w').write(str(os.getpid()))",
                                 ""))
    same = f"import os\nprint(os.getpid() == int(open({str(pid)!r}).read()))"
    _notebook(tmp_path / second, (same, "True\n"),
              ("print('left_behind' in dir())", "False\n"),
              ("import __main__\nprint(hasattr(__main__, '__spec__'))", "True\n"))
    _notebook(tmp_path / other, (same, "False\n"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.nbval_shared_kernel", "--nbval",
                          str(tmp_path / first), str(tmp_path / second), str(tmp_path / other)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "5 passed" in out.stdout, out.stdout[-3000:]
