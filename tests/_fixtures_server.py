"""A live Jupyter server with jupyter-gpusched on a small embedded simulated cluster.

Two ways to get one:

- in-process (pytest-jupyter): ``gpusched`` gives an :class:`ApiClient` around ``jp_fetch``;
  request ``jp_server_config`` from here (a test module re-exports it) for the extension's
  config, a header-driven identity provider (``X-Test-User``) and ``admin`` as an admin.
- out of process: :class:`ServerProcess` runs ``jupyter server`` in a subprocess, for clients
  that block (the CLI, schemathesis) and for restarts.

Import the fixtures into a test module (``from _fixtures_server import gpusched, ...``) or
list ``_fixtures_server`` in conftest's ``pytest_plugins``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from _fixtures_polling import wait_for, wait_for_async
from jsonschema import Draft202012Validator
from jupyter_server.auth.identity import IdentityProvider, User
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from tornado.httpclient import HTTPClientError, HTTPResponse
from traitlets.config import Config

from jupyter_gpusched.server.auth import GpuSchedUser

#: A start time far enough ahead that the job never starts in a test, inside the servers'
#: default not_before horizon (GpuSchedPolicy.max_not_before_s, a year).
FAR_FUTURE = (datetime.now(UTC) + timedelta(days=300)).replace(microsecond=0).isoformat()

OPENAPI = yaml.safe_load(
    resources.files("jupyter_gpusched.server").joinpath("openapi.yaml").read_text("utf-8")
)
_REGISTRY = Registry().with_resource(
    "urn:openapi", Resource.from_contents(OPENAPI, default_specification=DRAFT202012)
)


def conforms(body: Any, schema: str) -> Any:
    """Assert ``body`` matches a schema of the shipped OpenAPI file; return it."""
    validator = Draft202012Validator(
        {"$ref": f"urn:openapi#/components/schemas/{schema}"}, registry=_REGISTRY
    )
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
    assert not errors, errors
    return body


TOKEN_USER_HEADER = "X-Test-User"
TOKEN_GROUPS_HEADER = "X-Test-Groups"
TEST_NODES = [
    {
        "name": "g0",
        "gpu_model": "A100-80GB",
        "gpu_mem_gb": 80,
        "gpus": 4,
        "cpus": 32,
        "mem_gb": 256,
    },
    {"name": "g1", "gpu_model": "T4", "gpu_mem_gb": 16, "gpus": 2, "cpus": 8, "mem_gb": 64},
]


class HeaderIdentityProvider(IdentityProvider):
    """Token auth as usual; the user's name (and groups) come from headers, as a hub would say.

    Requests without the header are ``alice``; ``X-Test-Groups: a,b`` puts them in groups, as
    JupyterHub's user model does; admins are the server's ``admin_users``.
    """

    async def get_user(self, handler: Any) -> User | None:  # type: ignore[override]
        user = await self._get_user(handler)
        if user is None:
            return None
        name = handler.request.headers.get(TOKEN_USER_HEADER, "alice")
        groups = tuple(
            g for g in handler.request.headers.get(TOKEN_GROUPS_HEADER, "").split(",") if g
        )
        return GpuSchedUser(
            username=name, name=name, display_name=name, gpusched_admin=None, groups=groups
        )


def extension_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """``GpuSchedApp`` settings for a fast test server on its own store and sim directory."""
    return {
        "store_url": f"sqlite:///{tmp_path / 'gpusched.db'}",
        "sim_dir": "",
        "sim_nodes": TEST_NODES,
        "tick_interval_s": 0.05,
        "poll_interval_s": 0.05,
        "inventory_interval_s": 5.0,
        "admin_users": ["admin"],
        **overrides,
    }


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    """Per-module extra ``GpuSchedApp`` settings (override this fixture)."""
    return {}


@pytest.fixture
def jp_server_config(tmp_path: Path, gpusched_overrides: dict[str, Any]) -> Config:
    """Server config: our extension on, header identities, fast ticks, a 2-node sim."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"jupyter_gpusched": True},
                "identity_provider_class": HeaderIdentityProvider,
                "reraise_server_extension_failures": True,
            },
            # In-process: the test's own heap is not frozen (tests find leaks through gc).
            "GpuSchedApp": extension_config(tmp_path, **{"gc_freeze": False, **gpusched_overrides}),
        }
    )


class ApiClient:
    """``jp_fetch`` shaped as the API: one method per route, JSON in and out."""

    def __init__(self, fetch: Any, user: str = "alice") -> None:
        self._fetch = fetch
        self.user = user

    def as_user(self, user: str) -> ApiClient:
        """The same server, another identity."""
        return ApiClient(self._fetch, user)

    async def request(
        self,
        method: str,
        *path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        raw_body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> HTTPResponse:
        """Any request; HTTP errors come back as responses, not exceptions."""
        data = (
            raw_body
            if raw_body is not None
            else (json.dumps(body).encode() if body is not None else None)
        )
        if data is None and method in ("POST", "PATCH", "PUT"):
            data = b""
        hdrs = {TOKEN_USER_HEADER: self.user, **(headers or {})}
        try:
            return await self._fetch(
                "gpusched",
                "api",
                *path,
                method=method,
                body=data,
                params=params or {},
                headers=hdrs,
                allow_nonstandard_methods=True,
            )
        except HTTPClientError as err:
            assert err.response is not None, err
            return err.response

    async def json(self, method: str, *path: str, expect: int = 200, **kw: Any) -> Any:
        """A request whose answer must have status ``expect``; its JSON body."""
        resp = await self.request(method, *path, **kw)
        assert resp.code == expect, (resp.code, resp.body)
        return json.loads(resp.body)

    async def submit(self, expect: int = 201, **spec: Any) -> dict[str, Any]:
        """POST jobs."""
        return await self.json("POST", "jobs", body=spec, expect=expect)

    async def get(self, job_id: int) -> dict[str, Any]:
        """GET jobs/{id}."""
        return await self.json("GET", "jobs", str(job_id))

    async def wait_state(self, job_id: int, *states: str, timeout_s: float = 20.0) -> dict:
        """Poll until the job is in one of ``states``."""
        return await wait_for_async(
            lambda: self.get(job_id),
            lambda job: job["state"] in states,
            timeout_s=timeout_s,
            what=lambda job: f"job {job_id} to be {states}; it stayed {job['state']}",
        )


@pytest.fixture
def gpusched(jp_serverapp: Any, jp_fetch: Any, jp_asyncio_loop: Any) -> ApiClient:
    """The API of a started extension (pytest-jupyter does not run the server's start hooks)."""
    manager = jp_serverapp.extension_manager
    jp_asyncio_loop.run_until_complete(manager.start_extension("jupyter_gpusched"))
    assert "gpusched" in jp_serverapp.web_app.settings, "the scheduler did not start"
    return ApiClient(jp_fetch)


def script(code: str) -> list[str]:
    """argv of a Python one-liner job (the sim runs real local processes)."""
    return [sys.executable, "-c", code]


# ---------------------------------------------------------------------------- subprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def own_jupyter_env(root: Path) -> dict[str, str]:
    """This process's environment for a child on Jupyter dirs of its own under ``root``.

    The server a kernel would find (``GPUSCHED_URL``...) and a Hub token are left out.
    """
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    for key in ("GPUSCHED_URL", "GPUSCHED_TOKEN", "JUPYTERHUB_API_TOKEN"):
        env.pop(key, None)
    (root / "config").mkdir(parents=True, exist_ok=True)
    return env


class ServerProcess:
    """``jupyter server`` in a subprocess with our extension, on its own Jupyter dirs."""

    def __init__(
        self,
        root: Path,
        *,
        token: str = "test-token",
        policy: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        self.root = root
        self.token = token
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.env = own_jupyter_env(root)
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
                },
                "allow_root": True,
                "port": self.port,
                "ip": "127.0.0.1",
                "open_browser": False,
                "root_dir": str(root),
                "reraise_server_extension_failures": True,
            },
            "IdentityProvider": {"token": token},
            "GpuSchedApp": extension_config(root, **overrides),
            "GpuSchedPolicy": policy or {},
        }
        (root / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0, *, expect: int = 200) -> ServerProcess:
        """Start and wait until the scheduler answers (with status ``expect``)."""
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_server"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}:\n{self.log_text()}")
            req = urllib.request.Request(
                self.url + "gpusched/api/jobs?limit=1",
                headers={"Authorization": f"token {self.token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return bool(resp.status == expect)
            except urllib.error.HTTPError as err:  # e.g. 503 until the scheduler runs
                err.close()
                return err.code == expect

        try:
            wait_for(
                answers,
                timeout_s=timeout_s,
                interval_s=0.1,
                ignoring=(urllib.error.URLError, ConnectionError, TimeoutError),
                what="the server to answer",
            )
        except AssertionError:
            self.stop()
            raise RuntimeError(
                f"server did not answer within {timeout_s}s:\n{self.log_text()}"
            ) from None
        return self

    def stop(self, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> int | None:
        """SIGTERM (a clean shutdown; SIGKILL for a crash), then wait; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def log_text(self) -> str:
        """What the server printed."""
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def server_process(tmp_path: Path) -> Any:
    """A started subprocess server; stopped (and its sim jobs killed) afterwards."""
    server = ServerProcess(tmp_path).start()
    yield server
    server.stop()
