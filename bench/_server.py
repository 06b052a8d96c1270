"""A Jupyter server with only the gpusched extension, for the benchmarks that need one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

TOKEN = "bench-token"

#: A start time far enough ahead that a job never starts during a bench, within the
#: servers' default not_before horizon (a year).
FAR_FUTURE = (datetime.now(UTC) + timedelta(days=300)).replace(microsecond=0).isoformat()


def start_server(
    root: Path,
    store_url: str | None = None,
    gpusched: dict[str, object] | None = None,
    *,
    extensions: dict[str, bool] | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    """Start it under ``root`` (config, data, runtime dirs, log); wait until the API answers.

    Returns the process, its URL and the environment it runs in. The store defaults to a
    SQLite file under ``root``; the embedded simulated cluster is a fresh one unless
    ``gpusched`` (more ``GpuSchedApp`` settings) names ``nodes``. ``extensions``: more server
    extensions to load (bench modules: this folder is on the server's path); ``extra_env``:
    more environment for the server.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    env.pop("GPUSCHED_URL", None)
    env.update(extra_env or {})
    if extensions:
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    config = {
        "ServerApp": {
            # only ours: the others installed here (lab, lsp, ...) cost seconds to load
            "jpserver_extensions": {
                "jupyter_gpusched": True,
                "jupyterlab": False,
                "jupyter_lsp": False,
                "notebook_shim": False,
                "notebook": False,
                "jupyter_server_terminals": False,
                **(extensions or {}),
            },
            "port": port,
            "ip": "127.0.0.1",
            "open_browser": False,
            "allow_root": True,
            "root_dir": str(root),
            "log_level": "WARN",
        },
        "IdentityProvider": {"token": TOKEN},
        "GpuSchedApp": {
            "store_url": store_url or f"sqlite:///{root / 'gpusched.db'}",
            "sim_dir": "",
            **(gpusched or {}),
        },
    }
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                url + "gpusched/api/cluster", headers={"Authorization": f"token {TOKEN}"}
            )
            with urllib.request.urlopen(req, timeout=5):
                return proc, url, env
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start:\n{(root / 'server.log').read_text()}")
