"""One queue for a lab under a real JupyterHub: the service is Hub-managed, users are real.

JupyterHub (with configurable-http-proxy) spawns alice's and bob's servers as their own Unix
users; ``jupyter gpusched service`` runs as the Hub's ``gpusched`` service and knows callers by
their Hub token; the users' servers find it through the Hub (no ``service_url`` configured)
and forward to it with their own server token. carol holds ``custom:gpusched:admin``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import textwrap
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient, websocket

pytest.register_assert_rewrite("_fixtures_hub", "_fixtures_users")
from _fixtures_hub import Hub, HubFactory, ServiceSpec, http, hub_factory  # noqa: E402
from _fixtures_polling import scaled  # noqa: E402
from _fixtures_server import FAR_FUTURE, extension_config  # noqa: E402
from _fixtures_users import UnixUser, UserPython, unix_users, user_python  # noqa: E402
from _lab_scenarios import (  # noqa: E402
    definition_outlives_its_owners_server,
    one_queue,
    status_of,
)

from jupyter_gpusched.client.api import close_websocket  # noqa: E402

__all__ = ["hub_factory", "unix_users", "user_python"]  # fixtures

pytestmark = pytest.mark.slow

#: The Hub group whose members administer the queue (besides carol's scope).
ADMIN_GROUP = "gpu-admins"

#: Runs a notebook in a kernel as the calling Unix user, against that user's server.
RUN_CELLS = textwrap.dedent(
    """\
    import json, sys
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in json.loads(sys.argv[1])]
    NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=True).execute()
    out = nb.cells[-1].outputs
    print(json.dumps("".join(o.get("text", "") for o in out) or out))
    """
)


class HubLab:
    """The lab through its Hub: users' servers at /user/NAME/, the service managed."""

    def __init__(self, hub: Hub, users: dict[str, UnixUser], python: UserPython) -> None:
        self.hub = hub
        self.users = users
        self.python = python
        self.tokens = {name: hub.new_token(name) for name in ("alice", "bob", "carol")}

    def call(self, user: str, method: str, path: str, body: Any = None) -> Any:
        url = self.hub.server_url(user) + "gpusched/api/" + path
        return _ok(http(method, url, token=self.tokens[user], body=body), url)

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        url = self.hub.service_url() + "gpusched/api/" + path
        return _ok(http(method, url, token=self.tokens["carol"], body=body), url)

    def gpu_cell(self, user: str, source: str) -> str:
        env = self.users[user].env(
            self.python.path,
            GPUSCHED_URL=self.hub.server_url(user),
            GPUSCHED_TOKEN=self.tokens[user],
            JUPYTER_RUNTIME_DIR=str(self.hub.user_dir(user) / "runtime"),
        )
        cells = json.dumps(["%load_ext jupyter_gpusched", "%%gpu\n" + source])
        argv = self.python.argv("-c", RUN_CELLS, cells)
        done = self.users[user].run(argv, env=env, timeout=180)
        return str(json.loads(done.stdout.strip().splitlines()[-1]))

    def root(self, user: str) -> Path:
        return self.hub.user_dir(user) / "root"

    def hand_over(self, user: str) -> None:
        account = self.users[user]
        for path in [self.root(user), *self.root(user).rglob("*")]:
            os.chown(path, account.uid, account.gid)

    def stop_server(self, user: str) -> None:
        self.hub.stop_server(user)

    def start_server(self, user: str) -> None:
        self.hub.start_servers(user)


def _ok(response: Any, url: str) -> Any:
    if response.status >= 400:
        body = io.BytesIO(response.body)
        raise urllib.error.HTTPError(url, response.status, "", {}, body)  # type: ignore[arg-type]
    return response.json()


@pytest.fixture(scope="module")
def lab(
    hub_factory: HubFactory,
    unix_users: dict[str, UnixUser],
    user_python: UserPython,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[HubLab]:
    root = tmp_path_factory.mktemp("hub-service")
    config = {
        "GpuSchedApp": extension_config(root),
        # bob is in the Hub's group 'gpu-small', whose members may submit arrays of 2 at most
        "GpuSchedPolicy": {
            "windows": [{"name": "all"}],
            "group_limits": {"gpu-small": {"array_size": 2}},
        },
        "GpuSchedService": {"allow_root": True, "data_dir": str(root / "service-data")},
        "HubIdentityProvider": {"cache_s": 2, "admin_groups": [ADMIN_GROUP]},
    }
    (root / "service_config.json").write_text(json.dumps(config))
    env = {
        f"JUPYTER_{kind}_DIR": str(root / kind.lower()) for kind in ("CONFIG", "DATA", "RUNTIME")
    }
    command = [sys.executable, "-m", "jupyter_gpusched.cli.app", "service",
               f"--config={root / 'service_config.json'}"]  # fmt: skip
    service = ServiceSpec("gpusched", command, environment={**env, "PATH": os.environ["PATH"]})
    groups = {"JupyterHub": {"load_groups": {"gpu-small": {"users": ["bob"]}}}}
    hub = hub_factory(service=service, admins=["carol"], hub_config=groups)
    hub.start_servers("alice", "bob")
    try:
        yield HubLab(hub, unix_users, user_python)
    finally:
        hub.stop()


def test_users_servers_find_the_service_through_the_hub_and_run_as_their_users(
    lab: HubLab,
) -> None:
    for user in ("alice", "bob"):
        assert lab.call(user, "GET", "jobs?limit=1")["jobs"] is not None
    job = lab.call("bob", "POST", "jobs", {"kind": "script", "command": ["true"], "gpus": 0})
    assert job["spec"]["user"] == "bob"  # who the Hub says, not who the server claims
    plain = lab.hub.new_token("bob", scopes=["read:users!user=bob"])
    answer = http("GET", lab.hub.service_url() + "gpusched/api/jobs", token=plain)
    assert answer.status in (401, 403)  # a token without access to the service is refused


def test_one_queue_under_the_hub_fair_and_owned(lab: HubLab) -> None:
    one_queue(lab)


def test_a_definition_outlives_its_owners_stopped_server_under_the_hub(lab: HubLab) -> None:
    definition_outlives_its_owners_server(lab)


def test_the_hubs_groups_set_their_members_limits(lab: HubLab) -> None:

    three = {"kind": "script", "command": ["true"], "gpus": 0, "array": 3, "not_before": FAR_FUTURE}
    code, body = status_of(lab, "bob", "POST", "jobs", three)  # through bob's own server
    assert code == 422 and body["field"] == "array"
    assert "the limit (GpuSchedPolicy.group_limits['gpu-small'] array_size) is 2" in body["message"]
    assert lab.call("bob", "GET", "policy")["limits"]["your_groups"] == ["gpu-small"]
    queued = lab.call("alice", "POST", "jobs", three)  # not in the group
    for job in queued["jobs"]:
        lab.call("alice", "DELETE", f"jobs/{job['id']}")


async def _events(lab: HubLab, token: str) -> websocket.WebSocketClientConnection:
    """The service's events websocket, opened with a Hub token."""
    url = lab.hub.service_url().replace("http", "ws") + "gpusched/api/events?after=-1"
    request = httpclient.HTTPRequest(url, headers={"Authorization": f"token {token}"})
    return await websocket.websocket_connect(request)


async def _closed_within(ws: websocket.WebSocketClientConnection, timeout_s: float) -> Any:
    async def closed() -> Any:
        while await ws.read_message() is not None:
            pass
        return ws.close_code, ws.close_reason

    return await asyncio.wait_for(closed(), timeout_s)


@pytest.mark.asyncio
async def test_the_hub_revoking_a_token_or_an_admin_group_ends_those_streams_within_5_s(
    lab: HubLab,
) -> None:
    hub = lab.hub
    hub.api("POST", f"groups/{ADMIN_GROUP}")
    hub.api("POST", f"groups/{ADMIN_GROUP}/users", {"users": ["bob"]})
    made = hub.api("POST", "users/alice/tokens", {"note": "revoked by the test"})
    alice, bob = made["token"], hub.new_token("bob")
    secret = lab.call("alice", "POST", "jobs", {
        "kind": "script", "command": ["true"], "gpus": 0, "env": {"KEY": "s3cret"},
        "not_before": FAR_FUTURE,
    })  # fmt: skip
    seen = http("GET", f"{hub.service_url()}gpusched/api/jobs/{secret['id']}", token=bob)
    assert seen.json()["spec"]["env"] == {"KEY": "s3cret"}  # the group makes bob an admin
    hers, his = await _events(lab, alice), await _events(lab, bob)
    try:
        hub.api("DELETE", f"groups/{ADMIN_GROUP}/users", {"users": ["bob"]})
        assert await _closed_within(his, scaled(5.0)) == (
            1008,
            "bob is no longer an admin of the queue",
        )
        hub.api("DELETE", f"users/alice/tokens/{made['id']}")
        assert await _closed_within(hers, scaled(5.0)) == (1008, "the token of alice was revoked")
    finally:
        await close_websocket(hers)
        await close_websocket(his)
        hub.api("DELETE", f"groups/{ADMIN_GROUP}")
        lab.admin("DELETE", f"jobs/{secret['id']}")
