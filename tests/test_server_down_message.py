"""Which part is down, said plainly (issue #32).

With the user's Jupyter server running in client mode and the lab's service down, the CLI
said "no running Jupyter server ... start one with 'jupyter lab'": starting a second server
would not have helped.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from _fixtures_server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


def _dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


def test_the_cli_says_the_lab_service_is_down_not_that_no_server_runs(tmp_path: Path) -> None:
    dead = _dead_url()
    server = ServerProcess(tmp_path, service_url=dead, service_token="t").start(expect=502)
    try:
        env = {**server.env, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "jupyter_gpusched.cli.app", "queue"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        server.stop()
    assert done.returncode != 0
    said = done.stderr
    assert f"the Jupyter server at {server.url} runs, but the lab's gpusched service at " in said
    assert dead in said and "start the lab's service ('jupyter gpusched service'" in said
    assert "start one with 'jupyter lab'" not in said
