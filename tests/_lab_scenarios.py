"""What a lab does with one queue, written once for every way of running it.

``Lab`` is how a scenario reaches the users' own Jupyter servers (in client mode, forwarding
to the lab-wide service) and the service's admin; the no-Hub tests and the JupyterHub tests
implement it. alice and bob are users, carol administers the queue.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import nbformat
from _fixtures_polling import Deadline


class Lab(Protocol):
    """A lab's users, their servers, and the queue's admin."""

    def call(self, user: str, method: str, path: str, body: Any = None) -> Any:
        """One API call through ``user``'s own server; raises HTTPError on 4xx/5xx."""

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One API call as the queue's admin, straight to the service."""

    def gpu_cell(self, user: str, source: str) -> str:
        """Run ``%%gpu`` + ``source`` in a kernel of ``user``'s server; what it printed."""

    def root(self, user: str) -> Path:
        """``user``'s Jupyter root directory."""

    def hand_over(self, user: str) -> None:
        """Make what the test wrote into ``user``'s root theirs, as if they had written it."""

    def stop_server(self, user: str) -> None:
        """Stop ``user``'s server."""

    def start_server(self, user: str) -> None:
        """Start ``user``'s server again."""


def status_of(lab: Lab, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(HTTP status, JSON body) of a call, errors included."""
    try:
        return 200, lab.call(user, method, path, body)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "it") -> Any:
    """Poll ``check`` until it returns something true."""
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {deadline} waiting for {what}")


def sleeper(seconds: float, **spec: Any) -> dict[str, Any]:
    """A batch job that sleeps."""
    code = f"import time; time.sleep({seconds})"
    return {"kind": "script", "command": [sys.executable, "-c", code], **spec}


def write_nightly(root: Path) -> None:
    """``reports/nightly.ipynb`` under ``root``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('nightly ran')")]
    (root / "reports").mkdir(exist_ok=True)
    nbformat.write(nb, root / "reports" / "nightly.ipynb")


def one_queue(lab: Lab) -> None:
    """alice's lease and bob's batch job share one queue; fair share orders; owners decide."""
    # bob builds up usage: 4 GPUs for 3 s
    used = lab.call("bob", "POST", "jobs", sleeper(3, gpus=4, gpu_models=["A100"]))
    assert used["spec"]["user"] == "bob"
    wait_for(lambda: lab.call("bob", "GET", f"jobs/{used['id']}")["state"] == "succeeded", 60,
             "bob's run")  # fmt: skip

    # alice's %%gpu cell runs on a GPU through her server and the service's kernel bridge
    printed = lab.gpu_cell("alice", "import os\nprint('cuda', os.environ['CUDA_VISIBLE_DEVICES'])")
    assert "cuda GPU-" in printed, printed
    leases = lab.call("alice", "GET", "jobs?kind=lease")["jobs"]
    assert [lease["spec"]["user"] for lease in leases] == ["alice"]

    # one queue: bob sees alice's lease, alice sees bob's job
    bob_view = {j["id"]: j["spec"]["user"] for j in lab.call("bob", "GET", "jobs")["jobs"]}
    alice_view = {j["id"]: j["spec"]["user"] for j in lab.call("alice", "GET", "jobs")["jobs"]}
    assert bob_view[leases[0]["id"]] == "alice" and alice_view[used["id"]] == "bob"

    # fair share: with every A100 taken, alice (little use) goes before bob (more), though
    # bob asked first
    blocker = lab.admin("POST", "jobs", sleeper(60, gpus=4, gpu_models=["A100"]))
    wait_for(lambda: lab.call("bob", "GET", f"jobs/{blocker['id']}")["state"] == "running")
    bob_job = lab.call("bob", "POST", "jobs", sleeper(1, gpus=1, gpu_models=["A100"]))
    alice_job = lab.call("alice", "POST", "jobs", sleeper(1, gpus=1, gpu_models=["A100"]))

    def positions() -> dict[int, int] | None:
        jobs = {j["id"]: j for j in lab.call("alice", "GET", "jobs?state=queued")["jobs"]}
        got = {i: jobs[i].get("position") for i in (alice_job["id"], bob_job["id"]) if i in jobs}
        return got if len(got) == 2 and all(got.values()) else None

    order = wait_for(positions, 30, "queue positions")
    assert order[alice_job["id"]] < order[bob_job["id"]]

    # bob may not cancel alice's job; carol, the queue's admin, may cancel anyone's
    code, body = status_of(lab, "bob", "DELETE", f"jobs/{alice_job['id']}")
    assert code == 403 and "belongs to alice" in body["message"]
    assert lab.call("alice", "GET", f"jobs/{alice_job['id']}")["state"] == "queued"
    assert lab.admin("DELETE", f"jobs/{blocker['id']}")["state"] == "cancelled"


def definition_outlives_its_owners_server(lab: Lab) -> None:
    """alice's every-minute notebook fires while her server is down; its output comes home."""
    write_nightly(lab.root("alice"))
    lab.hand_over("alice")
    definition = lab.call(
        "alice",
        "POST",
        "definitions",
        {"notebook": "reports/nightly.ipynb", "schedule": "* * * * *"},
    )
    assert definition["user"] == "alice"
    lab.stop_server("alice")
    try:
        jobs = wait_for(
            lambda: [
                j
                for j in lab.admin("GET", "jobs?user=alice&kind=notebook&state=succeeded")["jobs"]
                if (j["outputs"] or {}).get("notebook")
            ],
            150,
            "alice's definition to fire and finish with her server down",
        )
    finally:
        lab.start_server("alice")
    rel = jobs[0]["outputs"]["notebook"]
    assert rel.startswith("reports/nightly-")
    copied = lab.root("alice") / rel
    wait_for(copied.exists, 30, "the output copied into alice's root")
    executed = nbformat.read(copied, as_version=4)
    assert "nightly ran" in "".join(o.get("text", "") for o in executed.cells[0].outputs)
    lab.call("alice", "DELETE", f"definitions/{definition['id']}")
