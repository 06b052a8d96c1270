"""A real ``jupyter lab`` with jupyter-gpusched on the embedded cluster, and a headless chromium.

``lab_server`` runs ``jupyter lab`` as a subprocess on a free port with a token, a temp root
dir and temp Jupyter dirs (data, runtime, config, lab settings), on the simulator's default
lab (a100-0, a100-1 with 8 GPUs, v100-0 with 4, t4-0 with 2). ``lab_page`` opens JupyterLab in
Debian's chromium (``/usr/bin/chromium``, driven by Python playwright; never ``playwright
install``) with the GPU panel shown. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import scaled, scaled_ms, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
BIN = Path(sys.executable).parent
#: The simulator's default lab: node -> GPUs.
SIM_NODES = {"a100-0": 8, "a100-1": 8, "v100-0": 4, "t4-0": 2}
#: Lab settings: no "Jupyter news" prompt or update check covering the panel.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def notebook(*sources: str) -> str:
    """A minimal nbformat-4 notebook with one code cell per source."""
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"c{i}",
            "metadata": {},
            "outputs": [],
            "source": src,
        }
        for i, src in enumerate(sources)
    ]
    return json.dumps(
        {
            "cells": cells,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A running ``jupyter lab``: where it listens, its token and its root dir."""

    url: str
    token: str
    root: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str) -> Any:
        """GET a JSON route under the server's base URL (reads only: the token's user is random)."""
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def log_tail(self, n: int = 60) -> str:
        """The server log's last lines, for failure messages."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def start_lab(
    base: Path,
    *extra_args: str,
    server_config: dict[str, Any] | None = None,
    wait_for_cluster: bool = True,
) -> LabServer:
    """Start ``jupyter lab`` under ``base`` and wait until it (and the cluster) answer.

    ``server_config`` goes to the user config dir's ``jupyter_server_config.json``, which
    overrides the sys-prefix config that enables the extension.
    """
    root, data, runtime, config, settings = (
        base / d for d in ("root", "data", "runtime", "config", "settings")
    )
    for d in (root, data, runtime, config):
        d.mkdir(parents=True, exist_ok=True)
    if server_config is not None:
        (config / "jupyter_server_config.json").write_text(json.dumps(server_config))
    for rel, value in LAB_SETTINGS.items():
        f = settings / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    port, token = _free_port(), "gpusched-lab-test-token"
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    args = [
        str(BIN / "jupyter"),
        "lab",
        f"--port={port}",
        "--ip=127.0.0.1",
        "--port-retries=0",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--LabApp.news_url=",
        "--GpuSchedApp.tick_interval_s=0.2",
        "--GpuSchedApp.poll_interval_s=0.5",
        *(["--allow-root"] if os.geteuid() == 0 else []),
        *extra_args,
    ]
    log_path = base / "jupyter-lab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(f"http://127.0.0.1:{port}/", token, root, proc, log_path)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited {proc.returncode}")
        try:
            server.api("api/status")
            return not wait_for_cluster or len(server.api("gpusched/api/cluster")["nodes"]) == len(
                SIM_NODES
            )
        except urllib.error.HTTPError as err:  # e.g. 503 until the scheduler runs
            err.close()
            return False

    try:
        wait_for(
            up,
            timeout_s=60,
            interval_s=0.25,
            ignoring=(urllib.error.URLError, ConnectionError, KeyError, json.JSONDecodeError),
            what="jupyter lab to come up",
        )
    except (AssertionError, RuntimeError) as exc:
        stop_lab(server)
        raise RuntimeError(f"{exc}; jupyter lab did not come up:\n{server.log_tail()}") from None
    return server


def stop_lab(server: LabServer) -> None:
    """Stop the server (SIGTERM, then SIGKILL its process group)."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=scaled(20))
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """``jupyter lab`` with gpusched on the default simulated cluster (one per test module)."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("lab")
    server = start_lab(base)
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Headless Debian chromium driven by playwright."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_lab(browser: Any, server: LabServer) -> Any:
    """A fresh page with JupyterLab loaded and the GPU panel open."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    page.goto(f"{server.url}lab?token={server.token}")
    page.wait_for_selector("#jp-main-dock-panel", state="visible")
    show_sidebar(page, "gpusched-panel")
    return page


def show_sidebar(page: Any, widget_id: str) -> None:
    """Show a left sidebar panel (clicking the tab of the shown one would collapse it).

    JupyterLab restores the sidebar's layout from the workspace while the page settles, so
    a tab that reads as current may still belong to a collapsed sidebar: click until shown.
    """
    tab = page.locator(f'.jp-SideBar [data-id="{widget_id}"]')
    tab.wait_for(state="visible")
    panel = page.locator(f"#{widget_id}")
    for _ in range(5):
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        try:
            panel.wait_for(state="visible", timeout=4_000)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: still collapsed
            if "lm-mod-current" in (tab.get_attribute("class") or ""):
                tab.click()  # expands the collapsed sidebar onto this tab
    panel.wait_for(state="visible")


@pytest.fixture
def lab_page(chromium: Any, lab_server: LabServer) -> Iterator[Any]:
    """JupyterLab in chromium with the GPU panel open."""
    page = open_lab(chromium, lab_server)
    yield page
    page.context.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-window screenshot to ``test-artifacts/<name>.png``."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
