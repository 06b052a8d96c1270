"""Notebook and definition routes through a live Jupyter server on the embedded cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_notebooks import outputs_text, read_notebook, write_notebook
from _fixtures_polling import wait_for_async
from _fixtures_server import conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


def is_error(resp: Any, status: int, error: str, field: str | None = None) -> dict:
    assert resp.code == status, (resp.code, resp.body)
    body = conforms(json.loads(resp.body), "Error")
    assert body["error"] == error, body
    if field is not None:
        assert body.get("field") == field, body
    return body


async def test_a_posted_notebook_runs_streams_progress_and_comes_back_beside_the_input(
    gpusched: ApiClient,
    jp_root_dir: Path,
    jp_ws_fetch: Any,
) -> None:
    write_notebook(
        jp_root_dir / "work" / "nb.ipynb",
        ["print(x * 2, type(x).__name__)", "y = x + 1"],
        parameters="x = 0",
    )
    ws = await jp_ws_fetch("gpusched", "api", "events", params={"after": 0})
    resp = await gpusched.request(
        "POST", "notebooks", body={"notebook": "work/nb.ipynb", "parameters": {"x": 21}, "gpus": 1}
    )
    assert resp.code == 201, resp.body
    answer = conforms(json.loads(resp.body), "NotebookSubmitted")
    job = answer["job"]
    assert answer["definition"] is None
    assert resp.headers["Location"].endswith(f"/gpusched/api/jobs/{job['id']}")
    assert (job["spec"]["kind"], job["spec"]["notebook"], job["user"]) == (
        "notebook",
        "work/nb.ipynb",
        "alice",
    )

    progress: list[int] = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if event.get("job_id") != job["id"]:
            continue
        if event["kind"] == "progress":
            progress.append(event["detail"]["cell"])
        if event["kind"] == "notebook_output":
            break
    ws.close()
    assert progress == [1, 2, 3, 4]  # parameters, injected parameters, two cells

    done = await wait_for_async(
        lambda: gpusched.get(job["id"]),
        lambda j: j["outputs"] is not None,
        timeout_s=60,
        what="the executed notebook",
    )
    assert done["state"] == "succeeded"
    out = jp_root_dir / done["outputs"]["notebook"]
    assert out.parent == jp_root_dir / "work" and out.name.startswith("nb-")
    assert outputs_text(read_notebook(out).cells[3]) == "42 int\n"
    assert (jp_root_dir / done["outputs"]["log"]).exists()


async def test_a_cron_definition_is_listed_paused_resumed_and_deleted(
    gpusched: ApiClient,
    jp_root_dir: Path,
) -> None:
    write_notebook(jp_root_dir / "nightly.ipynb", ["print('hi')"])
    resp = await gpusched.request(
        "POST",
        "notebooks",
        body={
            "notebook": "nightly.ipynb",
            "at": "0 3 * * *",
            "timezone": "Europe/Berlin",
            "catch_up": "once",
        },
    )
    assert resp.code == 201, resp.body
    created = conforms(json.loads(resp.body), "NotebookSubmitted")["definition"]
    assert resp.headers["Location"].endswith(f"/gpusched/api/definitions/{created['id']}")
    assert (created["schedule"], created["timezone"], created["catch_up"]) == (
        "0 3 * * *",
        "Europe/Berlin",
        "once",
    )
    assert created["next_fire_at"] is not None and created["user"] == "alice"

    direct = await gpusched.json(
        "POST",
        "definitions",
        expect=201,
        body={"notebook": "nightly.ipynb", "schedule": "*/30 * * * *", "paused": True},
    )
    assert direct["paused"] and direct["next_fire_at"] is None

    mine = conforms(
        await gpusched.json("GET", "definitions", params={"user": "me"}), "DefinitionList"
    )
    assert [d["id"] for d in mine["definitions"]] == [created["id"], direct["id"]]
    assert (await gpusched.as_user("bob").json("GET", "definitions", params={"user": "me"}))[
        "total"
    ] == 0

    path = ("definitions", str(created["id"]))
    is_error(
        await gpusched.as_user("bob").request("PATCH", *path, body={"paused": True}),
        403,
        "ForbiddenError",
    )
    paused = await gpusched.json("PATCH", *path, body={"paused": True})
    assert paused["paused"] and paused["next_fire_at"] is None
    resumed = conforms(await gpusched.json("PATCH", *path, body={"paused": False}), "Definition")
    assert not resumed["paused"] and resumed["next_fire_at"] is not None
    admin = await gpusched.as_user("admin").json("PATCH", *path, body={"schedule": "15 4 * * *"})
    assert admin["schedule"] == "15 4 * * *"

    assert (await gpusched.json("DELETE", *path))["id"] == created["id"]
    is_error(await gpusched.request("GET", *path), 404, "NotFoundError")


@pytest.mark.parametrize(
    "method,path,body,status,error,field",
    [
        ("POST", "notebooks", {"notebook": "missing.ipynb"}, 404, "NotFoundError", None),
        (
            "POST",
            "notebooks",
            {"notebook": "../outside.ipynb"},
            422,
            "InvalidSpecError",
            "notebook",
        ),
        (
            "POST",
            "notebooks",
            {"notebook": "ok.ipynb", "at": "whenever"},
            422,
            "InvalidSpecError",
            "at",
        ),
        (
            "POST",
            "notebooks",
            {"notebook": "ok.ipynb", "user": "eve"},
            422,
            "InvalidSpecError",
            "user",
        ),
        (
            "POST",
            "notebooks",
            {"notebook": "ok.ipynb", "command": ["sh"]},
            422,
            "InvalidSpecError",
            "command",
        ),
        (
            "POST",
            "notebooks",
            {"notebook": "ok.ipynb", "gpus": 99},
            422,
            "InvalidSpecError",
            "gpus",
        ),
        (
            "POST",
            "notebooks",
            {"notebook": "ok.ipynb", "at": "0 3 * * *", "catch_up": "all"},
            422,
            "InvalidSpecError",
            "catch_up",
        ),
        ("POST", "definitions", {"notebook": "ok.ipynb"}, 422, "InvalidSpecError", "schedule"),
        (
            "POST",
            "definitions",
            {"notebook": "ok.ipynb", "schedule": "0 3 * * *", "timezone": "Moon/Base"},
            422,
            "InvalidSpecError",
            "timezone",
        ),
        ("PATCH", "definitions/1", {"paused": "yes"}, 422, "InvalidSpecError", "paused"),
        ("PATCH", "definitions/1", {"owner": "bob"}, 422, "InvalidSpecError", "owner"),
        ("GET", "definitions/abc", None, 404, "NotFoundError", None),
        ("DELETE", "definitions/12345", None, 404, "NotFoundError", None),
    ],
)
async def test_bad_requests_say_what_to_fix(
    gpusched: ApiClient,
    jp_root_dir: Path,
    method: str,
    path: str,
    body: Any,
    status: int,
    error: str,
    field: str | None,
) -> None:
    write_notebook(jp_root_dir / "ok.ipynb", ["1"])
    if method == "PATCH":
        await gpusched.json(
            "POST",
            "definitions",
            expect=201,
            body={"notebook": "ok.ipynb", "schedule": "0 3 * * *"},
        )
    is_error(await gpusched.request(method, *path.split("/"), body=body), status, error, field)


# ---------------------------------------------------------------------------- the CLI


def cli(server: Any, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_gpusched.cli.app",
            *args,
            "--url",
            server.url,
            "--token",
            server.token,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_cli_submits_notebooks_and_manages_definitions(server_process: Any) -> None:
    root = Path(server_process.root)
    write_notebook(
        root / "cli.ipynb",
        ["print(lr, type(lr).__name__, layers)"],
        parameters="lr = 0\nlayers = []",
    )
    ran = cli(
        server_process,
        "submit-notebook",
        str(root / "cli.ipynb"),
        "-p",
        "lr=0.1",
        "-p",
        "layers=[64, 32]",
        "--gpus",
        "1",
        "--wait",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("job ") and " succeeded: cli.ipynb -> cli-" in ran.stdout
    out = root / ran.stdout.strip().rsplit(" -> ", 1)[1]
    assert outputs_text(read_notebook(out).cells[3]) == "0.1 float [64, 32]\n"

    made = cli(
        server_process,
        "submit-notebook",
        str(root / "cli.ipynb"),
        "--at",
        "0 2 * * *",
        "--timezone",
        "Europe/Berlin",
    )
    assert made.returncode == 0, made.stderr
    def_id = made.stdout.split()[1]
    assert "every day at 02:00" in made.stdout and "(Europe/Berlin; cron '0 2 * * *'" in made.stdout
    paused = cli(server_process, "definitions", "pause", def_id)
    assert paused.returncode == 0 and ": paused (" in paused.stdout and "0 runs)" in paused.stdout
    listed = cli(server_process, "definitions", "list")
    assert listed.stdout.startswith(f"definition {def_id} ")
    assert cli(server_process, "definitions", "delete", def_id).returncode == 0
    assert cli(server_process, "definitions").stdout.strip() == "no definitions"
    bad = cli(server_process, "submit-notebook", str(root / "cli.ipynb"), "-p", "2x=1")
    assert bad.returncode == 2 and "valid variable name" in bad.stderr
    gone = cli(server_process, "definitions", "show", def_id)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
