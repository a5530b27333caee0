"""Real-browser check: JupyterLab in headless Chromium runs the learner's notebooks that show
widgets and checks that the widgets render.

nbval executes the notebooks (their solution editions) but never renders a widget; only a
browser shows whether the widget manager is present ("Error displaying widget", or a text
fallback like ``IntSlider(value=...)`` instead of a slider). Steps, per notebook with a widget
(the learner's edition, as `make lab` opens it): open it, clear outputs, run all cells, wait
until every code cell has an execution count, then fail on an error output, a broken widget or a
text fallback. In 11_dashboard a slider is moved and the explorer's plot must change; in 02_ddp
the run panel's button is pressed and its live plot screenshotted to ``test-artifacts/``.
Notebooks without a widget are left to nbval, which runs every notebook already.

JupyterLab autosaves a notebook whose cells run longer than its interval, so the server is
given a temporary copy of ``notebooks/``: autosave can write only the copy. The interval is set
to a few seconds (default 120 s), and the test checks that the copy was written and the tracked
notebooks were not; ``make test`` then checks the whole working tree (tests/tree_state.py).

Under ``make test`` this check runs after nbval, and a run the solutions made (same resolved
configuration, nothing from the notebook's own code) is handed to the learner's edition from the
record nbval's kernels kept (tests/notebook_runs.py): what is checked here is that the learner's
edition runs and renders, and nbval has just checked those runs. The run panel's live run and
any run nbval did not make run for real; on its own (``make test-browser``) every run is real.

Needs Debian's chromium (``make browser-deps``); driven by Python Playwright.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
WIDGET_MARKERS = ("widgets.", "CardViewer", "DrillTrainer", "run_panel", "_explorer(", "_widget(")


def _shows_widgets(path: Path) -> bool:
    import json

    return any(c["cell_type"] == "code" and any(m in "".join(c["source"]) for m in WIDGET_MARKERS)
               for c in json.loads(path.read_text())["cells"])


NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb") if _shows_widgets(p))
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROME_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]
# A backstop, not a budget: the wait ends as soon as the last cell has run. One notebook took up
# to 330 s here on 2 cores with two busy-loop processes and a second suite running beside it.
RUN_TIMEOUT_S = 600
AUTOSAVE_S = 3  # far below JupyterLab's 120 s, so every run exercises autosave on the copy
BROKEN = ("Error displaying widget", "IntSlider(value=", "FloatLogSlider(", "VBox(children=",
          "Traceback (most recent call last)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digests(folder: Path) -> dict[str, tuple[int, str]]:
    import hashlib

    return {p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.glob("*.ipynb"))}


def _strip_outputs(path: Path) -> None:
    """The run clears every output first anyway; opening without them spares the browser drawing
    a notebook's stored figures only to throw them away (seconds per notebook on 2 cores)."""
    import json

    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None
    path.write_text(json.dumps(nb, indent=1))


@pytest.fixture(scope="module")
def lab():
    """JupyterLab serving a copy of notebooks/ (url, copy folder); the tracked files are never open."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} missing: run `make browser-deps` (apt-get install -y chromium)")
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="zeroedu-lab-")
    served = Path(tmp, "notebooks")
    served.mkdir()
    for p in (ROOT / "notebooks").glob("*.ipynb"):  # the learner's editions, as `make lab` opens them
        shutil.copy2(p, served / p.name)
        _strip_outputs(served / p.name)
    jupyter = str(Path(sys.executable).parent / "jupyter")
    cmd = [jupyter, "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.allow_root=True",
           f"--ServerApp.root_dir={served}", "--LabApp.expose_app_in_browser=True",
           f"--LabApp.workspaces_dir={tmp}", f"--LabApp.user_settings_dir={tmp}",
           "--ServerApp.disable_check_xsrf=True"]
    # Render every cell (JupyterLab 4 otherwise only attaches the cells in view) and skip the news toast.
    # Autosave every AUTOSAVE_S seconds: whatever it writes must land in the copy.
    settings = {"notebook-extension/tracker": '{"windowingMode": "none"}',
                "apputils-extension/notification": '{"fetchNews": "false"}',
                "docmanager-extension/plugin": f'{{"autosave": true, "autosaveInterval": {AUTOSAVE_S}}}'}
    for key, text in settings.items():
        ext, name = key.split("/")
        d = Path(tmp, "@jupyterlab", ext)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.jupyterlab-settings").write_text(text)
    log = open(os.path.join(tmp, "lab.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=served)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status", timeout=2)
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("JupyterLab did not start:\n" + open(os.path.join(tmp, "lab.log")).read()[-3000:])
            time.sleep(0.5)
    yield url, served
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        yield b
        b.close()


# JS run inside the page: the state of the notebook that is currently shown
_STATE_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const cells = [...panel.querySelectorAll('.jp-CodeCell')];
  const prompts = cells.map(c => (c.querySelector('.jp-InputArea-prompt') || {}).textContent || '');
  const outputs = [...panel.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText || '');
  const errors = [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                   .map(o => o.innerText || '');
  return {prompts, outputs, errors, widgets: panel.querySelectorAll('.jupyter-widgets').length};
}"""


# JS run inside the page while cells run, once a second: only what says "done" or "failed", read
# with textContent. (innerText lays the page out; on a notebook of 181 cells, every second, that
# takes the CPU the kernel needs. The full state above is read once, at the end.)
_PROGRESS_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell')]
                    .map(c => (c.querySelector('.jp-InputArea-prompt') || {}).textContent || '');
  const failed = [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                   .some(o => /Traceback|Error/.test(o.textContent || ''));
  return {prompts, failed};
}"""


def _cmd(page, command: str):
    page.evaluate(f"window.jupyterapp.commands.execute('{command}')")


def _run_all(page, url: str, name: str) -> dict:
    page.goto(f"{url}/lab/tree/{name}?reset")  # ?reset: a fresh workspace, no earlier tabs reopened
    page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=60_000)
    page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook-ExecutionIndicator')",
                           timeout=60_000)
    # wait for the kernel, then start from a blank page so every output below is from this run
    page.wait_for_function("() => { const p = window.jupyterapp.shell.currentWidget;"
                           " return p && p.sessionContext && p.sessionContext.session &&"
                           " p.sessionContext.session.kernel &&"
                           " p.sessionContext.session.kernel.connectionStatus === 'connected' &&"
                           " p.sessionContext.session.kernel.status === 'idle'; }", timeout=180_000)
    _cmd(page, "notebook:clear-all-cell-outputs")
    _cmd(page, "notebook:run-all-cells")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate(_PROGRESS_JS)
        if state and state["prompts"] and all(p.strip().startswith("[") and p.strip()[1:-2].isdigit()
                                             for p in state["prompts"]):
            return page.evaluate(_STATE_JS)
        if state and state["failed"]:
            return page.evaluate(_STATE_JS)  # an error stops run-all: report it now
        time.sleep(1.0)
    raise AssertionError(f"{name}: cells still running after {RUN_TIMEOUT_S} s; prompts {state and state['prompts']}")


def _check(name: str, state: dict):
    errs = [e for e in state["errors"] if "Traceback" in e or "Error" in e]
    assert not errs, f"{name}: error output:\n{errs[0][-2000:]}"
    for text in state["outputs"]:
        for bad in BROKEN:
            assert bad not in text, f"{name}: widget/output broken ({bad!r}):\n{text[:500]}"


def _shot(page, name: str):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_every_notebook_runs_and_renders(lab, browser):
    url, served = lab
    tracked_before, copy_before = _digests(ROOT / "notebooks"), _digests(served)
    assert any(n.startswith("02_") for n in NOTEBOOKS) and any(n.startswith("11_") for n in NOTEBOOKS)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    times = []
    try:
        for name in NOTEBOOKS:
            t0 = time.monotonic()
            state = _run_all(page, url, name)
            times.append((name, time.monotonic() - t0))
            _check(name, state)
            if name.startswith("11_"):
                _slider_changes_plot(page)
            if name.startswith("02_"):
                _run_panel_live(page)
            _shutdown_kernel(page, url)  # free its rank pool before the next notebook starts
    except BaseException:
        _shot(page, "browser-failure.png")
        raise
    finally:
        ctx.close()
        ARTIFACTS.mkdir(exist_ok=True)  # seconds per notebook, for the budget in tests/README.md
        (ARTIFACTS / "browser-times.txt").write_text("".join(f"{s:6.1f} s  {n}\n" for n, s in times))
    # Autosave really ran (it wrote the copy), and the tracked notebooks are byte for byte as before.
    copy_after = _digests(served)
    saved = [n for n in NOTEBOOKS if copy_after[n] != copy_before[n]]
    assert saved, f"autosave ({AUTOSAVE_S} s) wrote none of the served copies: the check proves nothing"
    assert _digests(ROOT / "notebooks") == tracked_before, "the browser test wrote a tracked notebook"


def _shutdown_kernel(page, url: str):
    kid = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")
    req = urllib.request.Request(f"{url}/api/kernels/{kid}", method="DELETE")
    urllib.request.urlopen(req, timeout=30)


def _slider_changes_plot(page):
    plot = page.locator(".zeroedu-explorer-plot").first
    plot.scroll_into_view_if_needed()
    before_png, before_html = plot.screenshot(), plot.inner_html()
    handle = page.locator(".jupyter-widgets .widget-slider .noUi-handle").first  # the Ψ slider
    handle.focus()
    for _ in range(10):
        page.keyboard.press("ArrowRight")
    page.wait_for_function("(h) => document.querySelector('.zeroedu-explorer-plot').innerHTML !== h",
                           arg=before_html, timeout=60_000)
    time.sleep(0.3)
    after_png = plot.screenshot()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "explorer-before.png").write_bytes(before_png)
    (ARTIFACTS / "explorer-after.png").write_bytes(after_png)
    assert after_png != before_png, "moving the Ψ slider did not change the explorer's plot"


def _run_panel_live(page):
    button = page.locator("button", has_text="Run on").first
    button.scroll_into_view_if_needed()
    panel = button.locator("xpath=ancestor::div[contains(@class,'widget-vbox')][last()]")
    button.click()
    page.wait_for_function("() => [...document.querySelectorAll('.widget-html-content')]"
                           ".some(e => e.innerText.includes('predicted vs measured'))", timeout=300_000)
    img = panel.locator("img").first
    img.wait_for(state="visible", timeout=10_000)
    page.wait_for_function("(el) => el.naturalWidth > 0", arg=img.element_handle(), timeout=10_000)
    ARTIFACTS.mkdir(exist_ok=True)
    panel.screenshot(path=str(ARTIFACTS / "run-panel-live.png"))
    text = panel.inner_text()
    assert "match: True" in text, text[-500:]
    assert "Error" not in text
