"""`make lab` (the README's first command) really serves JupyterLab on 127.0.0.1 with our notebooks."""
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_notebooks():
    port = _free_port()
    env = {**os.environ, "JUPYTER_TOKEN": "zeroedu-test"}
    proc = subprocess.Popen(["make", "-s", "lab", f"PORT={port}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline, body = time.monotonic() + 120, ""
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/api/contents?token=zeroedu-test"
                body = urllib.request.urlopen(url, timeout=2).read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        assert "01_collectives.ipynb" in body  # the server's root is notebooks/
        lab = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=zeroedu-test", timeout=5)
        assert lab.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
