"""One queue for a lab without a Hub: a service, and two users' servers in client mode.

alice and bob each run their own ``jupyter server`` whose extension forwards to one
``jupyter gpusched service`` with the token the service minted for them. carol is the
service's admin.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from _fixtures_live_server import execute, notebook, text
from _fixtures_server import ServerProcess
from _fixtures_service import ServiceProcess, client_server
from tornado import httpclient, websocket
from tornado.ioloop import IOLoop

pytestmark = pytest.mark.slow

SLEEP = "import time; time.sleep({})"


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    """One REST call to a user's own server (its token), as their notebook or CLI would."""
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + "gpusched/api/" + path,
        data=data,
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def status_of(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    try:
        return 200, call(server, method, path, body)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_for(check: Any, timeout_s: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def script(user_server: ServerProcess, seconds: float, **spec: Any) -> dict[str, Any]:
    import sys

    body = {"kind": "script", "command": [sys.executable, "-c", SLEEP.format(seconds)], **spec}
    return call(user_server, "POST", "jobs", body)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("lab")
    service = ServiceProcess(root / "service").start()
    servers = {
        user: client_server(root / user, service, service.mint(user)).start()
        for user in ("alice", "bob")
    }
    try:
        yield {"service": service, **servers}
    finally:
        for server in servers.values():
            server.stop()
        service.stop()


def write_nightly(folder: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import getpass\nprint('nightly ran')")]
    (folder / "reports").mkdir(exist_ok=True)
    nbformat.write(nb, folder / "reports" / "nightly.ipynb")


def test_one_queue_for_two_users_through_their_own_servers(lab: dict[str, Any]) -> None:
    service: ServiceProcess = lab["service"]
    alice: ServerProcess = lab["alice"]
    bob: ServerProcess = lab["bob"]

    # alice schedules a notebook every minute; her server sends its content to the service
    write_nightly(alice.root)
    definition = call(
        alice, "POST", "definitions", {"notebook": "reports/nightly.ipynb", "schedule": "* * * * *"}
    )
    assert definition["user"] == "alice"

    # bob builds up usage: 4 GPUs for 3 s
    used = script(bob, 3, gpus=4, gpu_models=["A100"])
    assert used["spec"]["user"] == "bob"
    wait_for(
        lambda: call(bob, "GET", f"jobs/{used['id']}")["state"] == "succeeded", 60, "bob's run"
    )

    # alice's %%gpu cell runs on a GPU through her server and the service's kernel bridge
    cells = notebook(
        "%load_ext jupyter_gpusched",
        "%%gpu --gpus 1\nimport os\nprint('cuda', os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    nb = execute(cells, alice, alice.root)
    assert "cuda GPU-" in text(nb.cells[1]), nb.cells[1].outputs
    # (the kernel released its lease when it shut down)
    leases = call(alice, "GET", "jobs?kind=lease")["jobs"]
    assert [lease["spec"]["user"] for lease in leases] == ["alice"]

    # one queue: bob sees alice's lease, alice sees bob's job
    bob_view = {j["id"]: j["spec"]["user"] for j in call(bob, "GET", "jobs")["jobs"]}
    alice_view = {j["id"]: j["spec"]["user"] for j in call(alice, "GET", "jobs")["jobs"]}
    assert bob_view[leases[0]["id"]] == "alice" and alice_view[used["id"]] == "bob"

    # fair share: with every GPU taken, alice (little use) goes before bob (more), though
    # bob asked first
    blocker = service.api(
        "POST", "jobs", {"kind": "script", "command": ["sleep", "60"], "gpus": 4,
                         "gpu_models": ["A100"]}, token=service.admin_token,
    )  # fmt: skip
    wait_for(lambda: call(bob, "GET", f"jobs/{blocker['id']}")["state"] == "running")
    bob_job = script(bob, 1, gpus=1, gpu_models=["A100"])
    alice_job = script(alice, 1, gpus=1, gpu_models=["A100"])

    def positions() -> dict[int, int] | None:
        jobs = {j["id"]: j for j in call(alice, "GET", "jobs?state=queued")["jobs"]}
        got = {i: jobs[i].get("position") for i in (alice_job["id"], bob_job["id"]) if i in jobs}
        return got if len(got) == 2 and all(got.values()) else None

    order = wait_for(positions, 30, "queue positions")
    assert order[alice_job["id"]] < order[bob_job["id"]]

    # bob may not cancel alice's job; carol, the service's admin, may cancel anyone's
    code, body = status_of(bob, "DELETE", f"jobs/{alice_job['id']}")
    assert code == 403 and "belongs to alice" in body["message"]
    assert call(alice, "GET", f"jobs/{alice_job['id']}")["state"] == "queued"
    service.api("DELETE", f"jobs/{blocker['id']}", token=service.admin_token)


def test_events_reach_each_user_through_their_server(lab: dict[str, Any]) -> None:
    bob: ServerProcess = lab["bob"]
    job = script(bob, 0.1)

    async def first_event_of_job() -> dict[str, Any]:
        url = bob.url.replace("http", "ws") + "gpusched/api/events?after=0"
        req = httpclient.HTTPRequest(url, headers={"Authorization": f"token {bob.token}"})
        conn = await websocket.websocket_connect(req)
        try:
            while True:
                message = json.loads(await conn.read_message())
                if message.get("job_id") == job["id"]:
                    return message
        finally:
            conn.close()

    event = IOLoop.current().run_sync(first_event_of_job, timeout=30)
    assert event["kind"] == "submitted" and event["job"]["spec"]["user"] == "bob"


def test_a_definition_fires_while_its_owners_server_is_down_and_its_output_comes_home(
    lab: dict[str, Any],
) -> None:
    service: ServiceProcess = lab["service"]
    alice: ServerProcess = lab["alice"]
    alice.stop()
    try:
        jobs = wait_for(
            lambda: [
                j
                for j in service.api(
                    "GET",
                    "jobs?user=alice&kind=notebook&state=succeeded",
                    token=service.admin_token,
                )["jobs"]
                if "output_notebook" in j["spec"]["labels"]
            ],
            150,
            "alice's definition to fire and finish with her server down",
        )
    finally:
        alice.start()
    rel = jobs[0]["spec"]["labels"]["output_notebook"]
    assert rel.startswith("reports/nightly-")
    copied = alice.root / rel
    wait_for(copied.exists, 30, "the output copied into alice's root")
    executed = nbformat.read(copied, as_version=4)
    assert "nightly ran" in "".join(o.get("text", "") for o in executed.cells[0].outputs)
