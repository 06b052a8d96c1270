"""No user reads another's work through the API: the exploits of issue #14, as regressions.

Two users (and an admin) on one embedded server, named by the test identity provider's
header: bob sees that alice's jobs exist and how they fare, never her env values, notebook
parameters, handle (pids, paths on the node), outputs or cell sources; the events websocket
sends each only what they may see; ``files`` and notebooks come only from inside the root;
labels stay plain data.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _fixtures_notebooks import write_notebook
from _fixtures_server import FAR_FUTURE, TOKEN_USER_HEADER, conforms, script

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

SECRET, PASSWORD, CELL = "s3cret-wandb-key", "hunter2-db", "SECRET_CELL_MARKER = 1"


async def _events(ws: Any, job_id: int, until: str) -> list[dict[str, Any]]:
    """Messages about ``job_id`` from a websocket, up to the first of kind ``until``."""
    seen = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if event.get("job_id") != job_id:
            continue
        seen.append(event)
        if event["kind"] == until:
            return seen


async def test_others_see_alices_job_without_its_env_values_handle_or_outputs(
    gpusched: ApiClient,
) -> None:
    alice, bob, admin = gpusched, gpusched.as_user("bob"), gpusched.as_user("admin")
    job = await alice.submit(
        kind="script",
        command=script("print('ran')"),
        env={"WANDB_API_KEY": SECRET},
        labels={"output_notebook": "javascript:alert(6)"},
    )
    await alice.wait_state(job["id"], "succeeded")
    mine = conforms(await alice.get(job["id"]), "Job")
    assert mine["spec"]["env"] == {"WANDB_API_KEY": SECRET}
    assert mine["handle"]["pid"] and not mine["redacted"]
    assert conforms(await admin.get(job["id"]), "Job")["spec"]["env"] == mine["spec"]["env"]

    theirs = conforms(await bob.get(job["id"]), "Job")
    listed = [j for j in (await bob.json("GET", "jobs"))["jobs"] if j["id"] == job["id"]]
    for view in (theirs, *listed):
        assert view["spec"]["env"] == {"WANDB_API_KEY": "<hidden>"}  # names only
        assert (view["handle"], view["outputs"], view["redacted"]) == ({}, None, True)
        # what the queue shows stays: who, what state, which labels (plain data)
        assert (view["user"], view["state"]) == ("alice", "succeeded")
        assert view["spec"]["labels"] == {"output_notebook": "javascript:alert(6)"}
        assert SECRET not in json.dumps(view)
    # a label is no output: the server sets those, and only for notebooks it ran
    assert mine["outputs"] is None


async def test_others_get_no_definition_parameters_and_no_progress_or_sources(
    gpusched: ApiClient, jp_root_dir: Path, jp_ws_fetch: Any
) -> None:
    alice, bob, admin = gpusched, gpusched.as_user("bob"), gpusched.as_user("admin")
    write_notebook(
        jp_root_dir / "nb.ipynb", [CELL, "print(DB_PASSWORD[:2])"], parameters="DB_PASSWORD = ''"
    )
    definition = await alice.json(
        "POST",
        "definitions",
        body={
            "notebook": "nb.ipynb",
            "schedule": "0 2 * * *",
            "parameters": {"DB_PASSWORD": PASSWORD},
        },
        expect=201,
    )
    seen = conforms(await bob.json("GET", "definitions", str(definition["id"])), "Definition")
    assert seen["spec"]["parameters"] == {} and PASSWORD not in json.dumps(seen)
    listed = await bob.json("GET", "definitions")
    assert PASSWORD not in json.dumps(listed)
    own = await alice.json("GET", "definitions", str(definition["id"]))
    assert own["spec"]["parameters"] == {"DB_PASSWORD": PASSWORD}

    sockets = {
        user: await jp_ws_fetch(
            "gpusched", "api", "events", params={"after": 0}, headers={TOKEN_USER_HEADER: user}
        )
        for user in ("alice", "bob")
    }
    answer = await alice.json(
        "POST",
        "notebooks",
        body={"notebook": "nb.ipynb", "parameters": {"DB_PASSWORD": PASSWORD}},
        expect=201,
    )
    job_id = answer["job"]["id"]
    got = {user: await _events(ws, job_id, "notebook_output") for user, ws in sockets.items()}
    for ws in sockets.values():
        ws.close()
    kinds = {user: [e["kind"] for e in events] for user, events in got.items()}
    assert "progress" in kinds["alice"] and "progress" not in kinds["bob"]
    assert CELL in json.dumps(got["alice"])
    # bob learns that it ran and how it ended, nothing of what it held
    assert {"submitted", "state", "notebook_output"} <= set(kinds["bob"])
    for event in got["bob"]:
        text = json.dumps(event)
        assert PASSWORD not in text and CELL not in text and "nb-" not in text, event
        assert event["job"]["redacted"] and event["job"]["handle"] == {}

    # the job's timeline (GET jobs/{id}/events) follows the websocket's rule, not its own
    pages = {
        who: conforms(await client.json("GET", "jobs", str(job_id), "events"), "JobEvents")
        for who, client in (("alice", alice), ("bob", bob), ("admin", admin))
    }
    for who in ("alice", "admin"):  # the owner and admins: the last cell and where outputs went
        kinds = [e["kind"] for e in pages[who]["events"]]
        assert "progress" in kinds and "notebook_output" in kinds, kinds
        output = next(e for e in pages[who]["events"] if e["kind"] == "notebook_output")
        assert output["detail"]["notebook"].startswith("nb-"), output
    theirs = pages["bob"]["events"]
    assert "progress" not in [e["kind"] for e in theirs]
    assert {"submitted", "state", "notebook_output"} <= {e["kind"] for e in theirs}
    for event in theirs:
        text = json.dumps(event)
        assert PASSWORD not in text and CELL not in text and "nb-" not in text, event


async def test_files_and_notebooks_must_lie_inside_the_root(
    gpusched: ApiClient, jp_root_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    write_notebook(outside / "x.ipynb", ["1"])
    (jp_root_dir / "data").mkdir()
    (jp_root_dir / "data" / "ok.txt").write_text("ok\n")
    (jp_root_dir / "leaky").mkdir()
    os.symlink("/etc/shadow", jp_root_dir / "leaky" / "shadow")
    refused = [
        ["/etc/shadow"],
        ["../outside"],
        [str(outside / "x.ipynb")],
        ["leaky"],  # a directory whose link leads out
    ]
    for files in refused:
        resp = await gpusched.request(
            "POST", "jobs", body={"kind": "script", "command": ["true"], "files": files}
        )
        body = json.loads(resp.body)
        assert (resp.code, body["field"]) == (422, "files"), (files, body)
        assert "outside your Jupyter root" in body["message"]
    resp = await gpusched.request("POST", "notebooks", body={"notebook": str(outside / "x.ipynb")})
    body = json.loads(resp.body)
    assert (resp.code, body["field"]) == (422, "notebook"), body
    job = await gpusched.submit(
        kind="script",
        command=["cat", "ok.txt"],
        files=["data/ok.txt"],
        not_before=FAR_FUTURE,
    )
    assert job["spec"]["files"] == [str((jp_root_dir / "data" / "ok.txt").resolve())]
