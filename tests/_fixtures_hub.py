"""A real JupyterHub on loopback: real proxy, real spawns as real Unix users, a managed service.

``hub_factory(service=..., singleuser_config=..., admins=...)`` starts ``jupyterhub`` (from the
venv, as root) with its own sqlite db, cookie secret and pid files in a private temp dir,
``configurable-http-proxy`` from npm in front of it, and the ``DummyAuthenticator`` (logins are
not what these tests exercise: users, tokens and servers are made through the REST API with an
admin token). Single-user servers are spawned for real by ``LocalProcessSpawner`` as the Unix
users of ``_fixtures_users`` with a Python they can run. ``tests/HUB-HARNESS.md`` says how the
gpusched service plugs in and which JupyterHub facts were checked.

Every process the hub starts (proxy, service, single-user servers, their kernels) carries
``GPUSCHED_TEST_RUN=<token>``: teardown kills exactly those after the hub's own cleanup.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import Deadline, scaled
from _fixtures_ssh import kill_marked
from _fixtures_users import REPO_ROOT, UnixUser, UserPython, shared_tempdir

CHP_LOCAL = REPO_ROOT / ".cache" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
ADMIN_SCOPE = "custom:gpusched:admin"
#: What the harness's own service token may do (the REST calls of ``Hub``).
HARNESS_SCOPES = [
    "admin:users", "admin:servers", "admin:groups", "tokens", "read:roles", "list:services"
]  # fmt: skip
#: Extensions installed in the venv that single-user servers skip by default (seconds each).
SLOW_EXTENSIONS = (
    "jupyterlab",
    "jupyter_lsp",
    "notebook",
    "notebook_shim",
    "jupyter_server_terminals",
)


def find_chp() -> str | None:
    """``configurable-http-proxy``: the repo-local npm install, else one on PATH."""
    if os.access(CHP_LOCAL, os.X_OK):
        return str(CHP_LOCAL)
    return shutil.which("configurable-http-proxy")


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServiceSpec:
    """A Hub-managed service: the hub starts ``command`` and proxies /services/NAME/ to it.

    The process gets JUPYTERHUB_SERVICE_NAME, JUPYTERHUB_API_TOKEN, JUPYTERHUB_API_URL,
    JUPYTERHUB_SERVICE_URL (``http://127.0.0.1:PORT``), JUPYTERHUB_SERVICE_PREFIX
    (``/services/NAME/``), the ``environment`` given here, and from the hub's own environment
    only LocalProcessSpawner's ``env_keep`` (PATH, PYTHONPATH, VIRTUAL_ENV, LANG, LC_ALL,
    LD_LIBRARY_PATH, CONDA_*): ``c.Spawner`` config does not reach services. If it exits, the
    hub starts it again.
    """

    name: str
    command: Sequence[str]
    port: int = field(default_factory=free_port)
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None  # Unix user to run as; None: the hub's (root)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_scope(self) -> str:
        """The scope a token needs for the service to let it in."""
        return f"access:services!service={self.name}"

    @property
    def read_scope(self) -> str:
        """The scope to read the service's model (url, prefix) from the Hub API."""
        return f"read:services!service={self.name}"


@dataclass
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    timeout: float = 30,
) -> Response:
    """One HTTP request; error statuses come back as responses, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    if data is None and method in ("POST", "PATCH", "PUT"):
        data = b""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read(), dict(err.headers))


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class Hub:
    """One ``jupyterhub`` process and the REST calls the tests make against it.

    Parameters
    ----------
    python
        The Python the single-user servers run (``user_python``).
    users
        Hub users (``allowed_users``); each must be a Unix account.
    service
        The managed service. Every user (role ``user``) and every server token
        (``server_token_scopes``) gets its access and read scopes.
    admins
        Users given ``custom:gpusched:admin`` (role ``gpusched-admin``).
    extra_roles
        More ``load_roles`` entries, e.g. the admin scope for a group.
    singleuser_config
        jupyter_server config of the users' servers, merged over the defaults (slow
        extensions off, the embedded cluster in a temp dir).
    hub_config
        Merged last over the generated JupyterHub config (dicts merge, other values replace).
    """

    def __init__(
        self,
        *,
        python: UserPython,
        users: Sequence[str],
        service: ServiceSpec | None = None,
        admins: Sequence[str] = (),
        extra_roles: Sequence[Mapping[str, Any]] = (),
        singleuser_config: Mapping[str, Any] | None = None,
        hub_config: Mapping[str, Any] | None = None,
    ) -> None:
        chp = find_chp()
        if chp is None:
            raise RuntimeError("configurable-http-proxy not found: run `make system-deps`")
        self.private = Path(tempfile.mkdtemp(prefix="gpusched-hub-"))  # 0700: db, secrets
        self.shared = shared_tempdir("gpusched-hub-users-")  # read by the single-user servers
        self.run_token = secrets.token_hex(8)
        self.admin_token = secrets.token_hex(32)
        self.service = service
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.api_url = f"{self.url}hub/api/"
        self.log_path = self.private / "jupyterhub.log"
        self.singleuser_config_dir = self.shared / "singleuser-config"
        self.singleuser_config_dir.mkdir(mode=0o755)
        self.write_singleuser_config(singleuser_config or {})
        self.users_dir = self.shared / "users"
        self.users_dir.mkdir(mode=0o755)
        for name in users:
            self._make_user_dirs(name)
        config = self._config(chp, python, users, admins)
        config["JupyterHub"]["load_roles"].extend(dict(role) for role in extra_roles)
        config = _deep_merge(config, hub_config or {})
        (self.private / "hub_config.json").write_text(json.dumps(config, indent=1))
        (self.private / "jupyterhub_config.py").write_text(
            _CONFIG_PY.format(json=str(self.private / "hub_config.json"), users=str(self.users_dir))
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def user_dir(self, name: str) -> Path:
        """The user's own dir for this hub (0700): ``root`` (their server's root dir), ``data``
        and ``runtime`` (JUPYTER_DATA_DIR, JUPYTER_RUNTIME_DIR: the extension's SQLite store
        lands there, not in the home dir shared with other sessions)."""
        return self.users_dir / name

    def _make_user_dirs(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        top = self.user_dir(name)
        for path in (top, top / "root", top / "data", top / "runtime"):
            path.mkdir(mode=0o700)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def write_singleuser_config(self, extra: Mapping[str, Any]) -> None:
        """The jupyter_server config of servers spawned from now on (merged over defaults)."""
        defaults = {
            "ServerApp": {"jpserver_extensions": dict.fromkeys(SLOW_EXTENSIONS, False)},
            # the embedded cluster in a temp dir: nothing left in the users' homes
            "GpuSchedApp": {"sim_dir": ""},
        }
        path = self.singleuser_config_dir / "jupyter_server_config.json"
        path.write_text(json.dumps(_deep_merge(defaults, extra), indent=1))
        path.chmod(0o644)

    def _config(
        self, chp: str, python: UserPython, users: Sequence[str], admins: Sequence[str]
    ) -> dict[str, Any]:
        secret = self.private / "cookie_secret"
        secret.write_text(secrets.token_hex(32))
        secret.chmod(0o600)
        marker = {"GPUSCHED_TEST_RUN": self.run_token}
        user_role_scopes = ["self"]
        services: list[dict[str, Any]] = [{"name": "harness", "api_token": self.admin_token}]
        token_scopes = ["access:servers!server", "users:activity!user", ADMIN_SCOPE]
        if self.service is not None:
            spec = self.service
            # access: let the token in; read: find the service's url and prefix from a server
            user_role_scopes += [spec.access_scope, spec.read_scope]
            token_scopes += [spec.access_scope, spec.read_scope]
            entry: dict[str, Any] = {
                "name": spec.name,
                "url": spec.url,
                "command": list(spec.command),
                "environment": {**spec.environment, **marker},
                "display": False,
            }
            if spec.user is not None:
                entry["user"] = spec.user
            services.append(entry)
        return {
            "JupyterHub": {
                "bind_url": self.url,
                "hub_bind_url": f"http://127.0.0.1:{free_port()}",
                "db_url": f"sqlite:///{self.private / 'jupyterhub.sqlite'}",
                "cookie_secret_file": str(secret),
                "pid_file": str(self.private / "jupyterhub.pid"),
                "authenticator_class": "dummy",
                "spawner_class": "localprocess",
                "cleanup_servers": True,
                "cleanup_proxy": True,
                # POST users/NAME/server answers 202 at once instead of blocking 10 s
                "tornado_settings": {"slow_spawn_timeout": 0},
                "services": services,
                "custom_scopes": {
                    ADMIN_SCOPE: {"description": "Administer the lab's GPU queue (gpusched)"}
                },
                "load_roles": [
                    # every user may reach the service (the stock 'user' role is just 'self')
                    {"name": "user", "scopes": user_role_scopes},
                    {"name": "gpusched-admin", "scopes": [ADMIN_SCOPE], "users": list(admins)},
                    {"name": "harness", "scopes": HARNESS_SCOPES, "services": ["harness"]},
                ],
            },
            "Authenticator": {"allowed_users": list(users)},
            "ConfigurableHTTPProxy": {
                "command": [chp],
                "api_url": f"http://127.0.0.1:{free_port()}",
                "pid_file": str(self.private / "proxy.pid"),
            },
            "Spawner": {
                "cmd": python.argv("-m", "jupyterhub.singleuser"),
                "server_token_scopes": token_scopes,
                "environment": {
                    **marker,
                    "PATH": python.path,
                    "JUPYTER_CONFIG_PATH": str(self.singleuser_config_dir),
                },
                # only what is set here: not the hub's PATH, PYTHONPATH or VIRTUAL_ENV
                "env_keep": ["LANG", "LC_ALL"],
                "notebook_dir": str(self.users_dir / "{username}" / "root"),
                "disable_user_config": True,  # ignore ~/.jupyter of the test users
                "start_timeout": 60,
                "http_timeout": 60,
            },
        }

    # ------------------------------------------------------------------ process

    def start(self, timeout_s: float = 60) -> Hub:
        """Start the hub; return once its API answers through the proxy (and the service
        port accepts connections)."""
        env = {**os.environ, "GPUSCHED_TEST_RUN": self.run_token}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(Path(sys.prefix) / "bin" / "jupyterhub"), "-f", "jupyterhub_config.py"],
                cwd=self.private,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # the hub adds its proxy routes once its managed services answer; polling the proxy
        # before that fills the log with 404s
        running = "JupyterHub is now running"
        self.wait_for(lambda: running in self.log_path.read_text(errors="replace"), timeout_s)
        self.wait_for(lambda: http("GET", self.api_url, timeout=2).status == 200, timeout_s)
        if self.service is not None:
            port = self.service.port
            self.wait_for(lambda: _accepts(port), timeout_s, f"service {self.service.name}")
        return self

    def wait_for(self, ready: Callable[[], bool], timeout_s: float, what: str = "hub") -> None:
        """Poll ``ready`` until true; fail with the hub log's tail if the hub dies or time runs
        out."""
        deadline = Deadline(timeout_s)
        while True:
            try:
                if ready():
                    return
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited ({self.proc.returncode}):\n{self.log()}")
            if deadline.expired():
                raise TimeoutError(f"{what} not ready after {deadline}:\n{self.log()}")
            time.sleep(0.05)

    def log(self, tail: int = 60) -> str:
        """The last lines of the hub's log (proxy, spawner and service output included)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:])

    def stop(self) -> None:
        """Stop the hub (it stops servers, proxy and service), then kill any straggler."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=scaled(20))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        kill_marked(self.run_token)
        shutil.rmtree(self.private, ignore_errors=True)
        shutil.rmtree(self.shared, ignore_errors=True)

    # ------------------------------------------------------------------ REST

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """A Hub REST call (admin token unless given) that must succeed; its JSON answer."""
        resp = http(method, self.api_url + path, token=token or self.admin_token, body=body)
        if resp.status >= 400:
            raise AssertionError(f"{method} hub/api/{path}: {resp.status} {resp.body!r}")
        return resp.json() if resp.body else None

    def user(self, name: str) -> dict[str, Any]:
        """The user's model with server state (the admin token holds admin:server_state)."""
        return self.api("GET", f"users/{name}")

    def start_servers(self, *names: str, timeout_s: float = 60) -> None:
        """Spawn the users' default servers (all at once) and wait until each is ready."""
        for name in names:
            self.api("POST", f"users/{name}/server")
        for name in names:

            def ready(name: str = name) -> bool:
                return bool(self.user(name)["servers"].get("", {}).get("ready"))

            self.wait_for(ready, timeout_s, f"{name}'s server")

    def stop_server(self, name: str, timeout_s: float = 30) -> None:
        """Stop the user's default server and wait until the hub has no server for them."""
        self.api("DELETE", f"users/{name}/server")
        self.wait_for(lambda: "" not in self.user(name)["servers"], timeout_s, f"{name} stop")

    def server_pid(self, name: str) -> int:
        """Pid of the user's single-user server process (LocalProcessSpawner's state)."""
        return int(self.user(name)["servers"][""]["state"]["pid"])

    def server_url(self, name: str) -> str:
        """The user's server through the proxy (``/user/NAME/``)."""
        return f"{self.url}user/{name}/"

    def service_url(self) -> str:
        """The managed service through the proxy (``/services/NAME/``)."""
        assert self.service is not None, "this hub has no managed service"
        return f"{self.url}services/{self.service.name}/"

    def server_token(self, name: str) -> str:
        """The JUPYTERHUB_API_TOKEN the hub gave the user's running server: the token a
        server in client mode calls the service with (scopes: ``server_token_scopes``)."""
        return process_env(self.server_pid(name))["JUPYTERHUB_API_TOKEN"]

    def new_token(self, name: str, scopes: Sequence[str] | None = None) -> str:
        """A fresh API token for the user; None = all the user's own permissions."""
        body: dict[str, Any] = {"note": "gpusched test", "expires_in": 3600}
        if scopes is not None:
            body["scopes"] = list(scopes)
        return str(self.api("POST", f"users/{name}/tokens", body)["token"])

    def whoami(self, token: str) -> dict[str, Any]:
        """GET hub/api/user with ``token``: who it identifies and its scopes."""
        return self.api("GET", "user", token=token)


# Loads the JSON config, then adds what JSON cannot say: per-user environment values (callables
# of the spawner, evaluated at spawn time).
_CONFIG_PY = """\
import json
from traitlets.config import Config

c.merge(Config(json.load(open({json!r}))))


def _user_dir(kind):
    return lambda spawner: f"{users}/{{spawner.user.name}}/{{kind}}"


c.Spawner.environment["JUPYTER_DATA_DIR"] = _user_dir("data")
c.Spawner.environment["JUPYTER_RUNTIME_DIR"] = _user_dir("runtime")
"""


def _accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def process_uid(pid: int) -> int:
    """Real uid of a live process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def process_env(pid: int) -> dict[str, str]:
    """Environment a live process started with (root reads anyone's)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


HubFactory = Callable[..., Hub]


@pytest.fixture(scope="session")
def hub_factory(unix_users: dict[str, UnixUser], user_python: UserPython) -> Iterator[HubFactory]:
    """``hub_factory(**Hub keyword arguments)``: a started Hub for alice, bob and carol; every
    hub is stopped at the end of the session (or earlier by ``hub.stop()``). Skips when not
    root or the proxy is not installed."""
    if find_chp() is None:
        pytest.skip("configurable-http-proxy is not installed: run `make system-deps`")
    hubs: list[Hub] = []

    def start(**kwargs: Any) -> Hub:
        hub = Hub(python=user_python, users=list(unix_users), **kwargs)
        hubs.append(hub)
        return hub.start()

    try:
        yield start
    finally:
        for hub in hubs:
            hub.stop()
