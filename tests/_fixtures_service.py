"""The lab-wide service in a subprocess, and users' Jupyter servers in client mode.

``ServiceProcess`` runs ``jupyter gpusched service`` (token auth, embedded sim cluster) on its
own Jupyter dirs and store; its first start mints the admin's token with ``jupyter gpusched
service token USER`` on the same config, and ``mint(user)`` makes more with the two store calls
that command makes (a CLI start costs ~3 s of CPU: seconds more on a busy machine).
``client_server(root, service, user)`` is a ``jupyter server`` subprocess whose extension
forwards to the service as ``user``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _fixtures_polling import scaled, wait_for
from _fixtures_server import ServerProcess, _free_port, extension_config, own_jupyter_env

from jupyter_gpusched.core.clock import SystemClock
from jupyter_gpusched.store import tokens
from jupyter_gpusched.store.store import Store


class ServiceProcess:
    """``jupyter gpusched service`` in a subprocess."""

    def __init__(
        self,
        root: Path,
        *,
        store_url: str | None = None,
        admins: tuple[str, ...] = ("carol",),
        sim_dir: str = "",
        policy: dict[str, Any] | None = None,
        service: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        self.root = root
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.env = own_jupyter_env(root)
        gpusched = extension_config(root, sim_dir=sim_dir, **overrides)
        if store_url:
            gpusched["store_url"] = store_url
        self.store_url: str = gpusched["store_url"]
        config: dict[str, Any] = {
            # no day/night surprises unless asked for; the per-user limits are the service's
            # defaults, but the harness's admin submits loads in loops on purpose
            "GpuSchedPolicy": {
                "admin_limits": {"submits_per_s": None, "queued_jobs": None},
                **(policy or {"windows": [{"name": "all"}]}),
            },
            "GpuSchedService": {
                "port": self.port,
                "allow_root": True,
                "data_dir": str(root / "service-data"),
                **(service or {}),  # GpuSchedService settings (timeouts, the connection cap)
            },
            "StoreTokenIdentityProvider": {"admin_users": list(admins)},
            "GpuSchedApp": gpusched,
        }
        (root / "config" / "jupyter_gpusched_service_config.json").write_text(json.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.admins = admins
        self.admin_token = ""
        self.log_offset = 0  # where the log of the current run starts

    def _cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "jupyter_gpusched.cli.app", "service", *args],
            env=self.env,
            capture_output=True,
            text=True,
            # ~3 s of CPU on a quiet box (it imports jupyter_server and opens the store)
            timeout=scaled(60),
            check=True,
        )
        return done.stdout.strip()

    def mint(self, user: str) -> str:
        """A new API token for ``user``, made as ``service token USER`` makes it."""
        store = Store(self.store_url, clock=SystemClock())
        try:
            store.migrate()
            return tokens.mint(store, user)
        finally:
            store.close()

    def start(self, timeout_s: float = 60.0, *, wait: bool = True) -> ServiceProcess:
        """Start; unless ``wait`` is False, wait until the API answers."""
        if not self.admin_token:  # through the CLI, as an operator makes the first token
            self.admin_token = self._cli("token", self.admins[0]).splitlines()[-1]
        log_path = self.root / "service.log"
        self.log_offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_gpusched.cli.app", "service"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        if wait:
            self.wait_answering(timeout_s)
        return self

    def wait_answering(self, timeout_s: float = 60.0) -> None:
        """Until the API answers the admin's token (``timeout_s``: a quiet box's seconds)."""
        proc = self.proc
        assert proc is not None

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"service exited {proc.returncode}:\n{self.log_text()}")
            try:
                self.api("GET", "jobs?limit=1", token=self.admin_token)
            except urllib.error.HTTPError as err:  # 503 (or 401) while it starts
                err.close()
                return False
            return True

        try:
            wait_for(
                answers,
                timeout_s=timeout_s,
                interval_s=0.1,
                ignoring=(urllib.error.URLError, ConnectionError, TimeoutError),
                what="the service to answer",
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}:\n{self.log_text()}") from None

    def api(self, method: str, path: str, body: Any = None, *, token: str) -> Any:
        """One REST call with ``token``; the JSON answer (HTTPError on 4xx/5xx)."""
        with urllib.request.urlopen(self._request(method, path, body, token), timeout=30) as resp:
            return json.loads(resp.read())

    def call(
        self, method: str, path: str, body: Any = None, *, token: str, timeout_s: float = 60
    ) -> tuple[int, Any, Any]:
        """One REST call with ``token``: (status, JSON answer or None, headers), errors too."""
        req = self._request(method, path, body, token)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read()), resp.headers
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read() or b"null"), err.headers

    def _request(self, method: str, path: str, body: Any, token: str) -> urllib.request.Request:
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(
            self.url + "gpusched/api/" + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        """SIGTERM (clean) or SIGKILL (a crash), then wait."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(scaled(timeout_s))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_text(self, *, this_run: bool = False) -> str:
        """What the service printed (in every run, or since its last start)."""
        path = self.root / "service.log"
        if not path.exists():
            return ""
        with open(path, "rb") as f:
            f.seek(self.log_offset if this_run else 0)
            return f.read().decode(errors="replace")


def client_server(root: Path, service: ServiceProcess, token: str) -> ServerProcess:
    """A user's ``jupyter server`` (not started) forwarding to ``service`` with ``token``."""
    root.mkdir(parents=True, exist_ok=True)
    return ServerProcess(root, service_url=service.url, service_token=token)
