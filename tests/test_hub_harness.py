"""The JupyterHub harness works: real hub and proxy, servers spawned as their Unix users, a
Hub-managed service that authenticates callers by their Hub token.

The managed service here is a stand-in (this file run as a script, see ``serve_whoami``): it
answers ``whoami`` for whoever its ``HubAuth`` lets in, which is what the gpusched service will
do in front of its API.
"""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("_fixtures_hub", "_fixtures_users")
from _fixtures_hub import (  # noqa: E402
    ADMIN_SCOPE,
    Hub,
    HubFactory,
    ServiceSpec,
    http,
    hub_factory,
    process_env,
    process_uid,
)
from _fixtures_users import UnixUser, UserPython, unix_users, user_python  # noqa: E402

__all__ = ["hub_factory", "unix_users", "user_python"]  # fixtures

pytestmark = pytest.mark.slow

SERVICE = "gpusched"
SPAWNED = ("alice", "bob", "carol")
ADMINS = ("carol",)


@pytest.fixture(scope="module")
def hub(hub_factory: HubFactory) -> Iterator[Hub]:
    """One hub for the module: the stand-in service, carol as gpusched admin, alice, bob and
    carol's servers running (spawned together), alice marked admin in her server's config."""
    source = f"{textwrap.dedent(inspect.getsource(serve_whoami))}\nserve_whoami()\n"
    service = ServiceSpec(SERVICE, [sys.executable, "-c", source], environment={"CACHE_S": "1"})
    hub = hub_factory(
        service=service,
        admins=ADMINS,
        # the servers' own schedulers (not client mode: the stand-in is no gpusched service)
        singleuser_config={"GpuSchedApp": {"admin_users": ["alice"], "hub_service_name": ""}},
    )
    hub.start_servers(*SPAWNED)
    yield hub
    hub.stop()


def whoami_at_service(hub: Hub, token: str | None, *, direct: bool = False) -> Any:
    """The stand-in's answer, through the proxy or straight at the service's own URL."""
    assert hub.service is not None
    base = f"{hub.service.url}/services/{SERVICE}/" if direct else hub.service_url()
    return http("GET", base + "whoami", token=token)


def test_a_command_run_as_a_user_has_their_uid_and_home_and_imports_the_project(
    unix_users: dict[str, UnixUser], user_python: UserPython
) -> None:
    bob = unix_users["bob"]
    code = "import os, jupyter_gpusched; print(os.getuid(), os.getcwd(), os.environ['HOME'])"
    out = bob.run(user_python.argv("-c", code), env=bob.env(user_python.path)).stdout.split()
    assert out == [str(bob.uid), str(bob.home), str(bob.home)]
    assert bob.run(["cat", "/etc/shadow"], check=False).returncode != 0


@pytest.mark.parametrize("name", SPAWNED)
def test_each_server_runs_under_its_owners_uid_and_home(
    hub: Hub, unix_users: dict[str, UnixUser], name: str
) -> None:
    pid = hub.server_pid(name)
    env = process_env(pid)
    assert process_uid(pid) == unix_users[name].uid
    assert (env["USER"], env["HOME"]) == (name, str(unix_users[name].home))
    assert env["JUPYTERHUB_USER"] == name
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == f"/user/{name}/"


@pytest.mark.parametrize("name", ["alice", "bob"])
def test_service_identifies_the_user_behind_a_token(hub: Hub, name: str) -> None:
    token = hub.new_token(name)
    for direct in (False, True):
        resp = whoami_at_service(hub, token, direct=direct)
        assert resp.status == 200, resp.body
        assert (resp.json()["name"], resp.json()["kind"]) == (name, "user")


@pytest.mark.parametrize(
    "scopes",
    [["read:users!user=alice"], ["access:servers!user=alice"]],
    ids=["read-only", "servers-only"],
)
def test_service_refuses_a_token_without_its_access_scope(hub: Hub, scopes: list[str]) -> None:
    token = hub.new_token("alice", scopes=scopes)
    assert hub.whoami(token)["name"] == "alice"  # a valid token, just not for the service
    assert whoami_at_service(hub, token).status == 403
    assert whoami_at_service(hub, None).status == 403
    assert whoami_at_service(hub, "not-a-token").status == 403


@pytest.mark.parametrize("name", SPAWNED)
def test_server_token_reaches_the_service_with_admin_scope_only_for_admins(
    hub: Hub, name: str
) -> None:
    resp = whoami_at_service(hub, hub.server_token(name))
    assert resp.status == 200, resp.body
    assert resp.json()["name"] == name
    assert (ADMIN_SCOPE in resp.json()["scopes"]) == (name in ADMINS)


@pytest.mark.parametrize("name", SPAWNED)
def test_user_token_carries_admin_scope_only_for_admins(hub: Hub, name: str) -> None:
    scopes = whoami_at_service(hub, hub.new_token(name)).json()["scopes"]
    assert f"access:services!service={SERVICE}" in scopes
    assert (ADMIN_SCOPE in scopes) == (name in ADMINS)


def test_server_token_finds_the_service_in_the_hub_api(hub: Hub) -> None:
    assert hub.service is not None
    model = hub.api("GET", f"services/{SERVICE}", token=hub.server_token("bob"))
    assert (model["url"], model["prefix"]) == (hub.service.url, f"/services/{SERVICE}/")


def test_service_gets_the_hub_env_and_runs_as_the_hub(hub: Hub) -> None:
    assert hub.service is not None
    answer = whoami_at_service(hub, hub.new_token("alice")).json()
    assert answer["uid"] == os.getuid()
    env = answer["env"]
    assert env["JUPYTERHUB_SERVICE_NAME"] == SERVICE
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == f"/services/{SERVICE}/"
    assert env["JUPYTERHUB_SERVICE_URL"] == hub.service.url
    assert env["JUPYTERHUB_API_URL"].endswith("/hub/api")
    assert env["JUPYTERHUB_API_TOKEN"]
    # LocalProcessSpawner's env_keep (c.Spawner config does not reach services)
    assert env["PATH"] == os.environ["PATH"]


def test_singleuser_config_reaches_the_extension_in_each_server(hub: Hub) -> None:
    alice, bob = hub.new_token("alice"), hub.new_token("bob")
    everyone = "gpusched/api/leases?user=all"  # admins only
    assert http("GET", hub.server_url("alice") + everyone, token=alice).status == 200
    assert http("GET", hub.server_url("bob") + everyone, token=bob).status == 403
    # bob's server does not know alice's token at all (no access:servers for it)
    assert http("GET", hub.server_url("bob") + "gpusched/api/jobs", token=alice).status == 401


def test_stopping_a_server_ends_its_process_and_revokes_its_token(hub: Hub) -> None:
    pid, token = hub.server_pid("alice"), hub.server_token("alice")
    hub.stop_server("alice")
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()
    assert http("GET", hub.api_url + "user", token=token).status == 403
    # the service's HubAuth cache (1 s here) forgets it within a second
    hub.wait_for(lambda: whoami_at_service(hub, token).status == 403, 5, "token revocation")
    assert hub.user("alice")["servers"] == {}
    assert hub.user("bob")["servers"][""]["ready"]  # the others keep running


# ------------------------------------------------------------------ the stand-in service


def serve_whoami() -> None:
    """The Hub-managed service (its source is the service's ``python -c`` command, so it
    imports nothing of this module): ``GET {prefix}whoami`` answers who the token is."""
    import asyncio
    import os
    from urllib.parse import urlparse

    from jupyterhub.services.auth import HubAuth, HubAuthenticated
    from tornado import web

    class WhoAmI(HubAuthenticated, web.RequestHandler):  # type: ignore[misc]
        def initialize(self, hub_auth: HubAuth) -> None:
            self.hub_auth = hub_auth

        def get(self) -> None:
            user = self.get_current_user()
            if user is None:
                self.set_status(403)
                self.finish({"message": "no Hub token with access to this service"})
                return
            env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_TEST_RUN"}
            self.finish({**user, "uid": os.getuid(), "env": env})

    async def main() -> None:
        prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
        # HubAuth caches the Hub's answer per token: 300 s by default, 0 = forever
        auth = HubAuth(cache_max_age=int(os.environ["CACHE_S"]))
        app = web.Application([(prefix + "whoami", WhoAmI, {"hub_auth": auth})])
        app.listen(urlparse(os.environ["JUPYTERHUB_SERVICE_URL"]).port or 80, "127.0.0.1")
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # the hub stops services with SIGINT
        pass
