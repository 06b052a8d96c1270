"""Bad input through a live server: a clear 4xx naming what to fix, and nothing left behind.

Issue #30's second user sent absurd numbers and times (accepted, then every pass failed),
NUL bytes (accepted, then the node's agent stalled), uploads and notebook paths that collide
as file and folder (500), and uploads with jobs that were refused (the files stayed on disk).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_server import conforms

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

NB = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def upload(name: str, text: str = "x") -> dict[str, Any]:
    return {"name": name, "content_base64": base64.b64encode(text.encode()).decode()}


def refused(resp: Any, status: int, field: str | None, says: str) -> None:
    assert resp.code == status, (resp.code, resp.body)
    body = conforms(json.loads(resp.body), "Error")
    assert body["field"] == field, body
    assert says in body["message"], body


def files_under(folder: Path) -> list[str]:
    return sorted(
        str(Path(d, n).relative_to(folder)) for d, _, names in os.walk(folder) for n in names
    )


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"max_runtime_s": 3e11}, "max_runtime_s", "GpuSchedPolicy.max_runtime_s"),
        ({"max_runtime_s": 1e308}, "max_runtime_s", "at most 2592000 seconds"),
        ({"not_before": "9999-12-31T23:00:00Z"}, "not_before", "GpuSchedPolicy.max_not_before_s"),
        ({"command": ["echo", "a\u0000b"]}, "command", "control character"),
        ({"env": {"K": "v\u0000"}}, "env", "control character"),
        ({"name": "\u001b]0;owned\u0007"}, "name", "control character"),
    ],
)
async def test_absurd_values_and_control_characters_get_422_naming_the_field(
    gpusched: ApiClient, fields: dict[str, Any], field: str, says: str
) -> None:
    resp = await gpusched.request(
        "POST", "jobs", body={"kind": "script", "command": ["true"], **fields}
    )
    refused(resp, 422, field, says)


async def test_a_notebook_with_an_absurd_retry_backoff_is_refused(gpusched: ApiClient) -> None:
    body = {"notebook": "nb.ipynb", "content": NB, "retries": 2, "retry_backoff_s": 1e308}
    refused(await gpusched.request("POST", "notebooks", body=body), 422, "retry_backoff_s", "")


@pytest.mark.parametrize("names", [["d/x", "d"], ["d", "d/x"], ["a", "a"]])
async def test_uploads_that_collide_as_file_and_folder_get_422_and_nothing_is_written(
    gpusched: ApiClient, jp_serverapp: Any, names: list[str]
) -> None:
    body = {"kind": "script", "command": ["true"], "uploads": [upload(n) for n in names]}
    refused(await gpusched.request("POST", "jobs", body=body), 422, "uploads.1.name", "collides")
    users = Path(jp_serverapp.web_app.settings["gpusched_data_dir"]) / "users"
    assert not users.exists() or files_under(users) == []


@pytest.mark.parametrize(
    ("fields", "status"),
    [({"gpus": 99}, 422), ({"gpus": 8}, 422), ({"max_runtime_s": -1}, 422)],
    ids=["bad-field", "never-fits", "negative"],
)
async def test_uploads_of_a_refused_job_are_not_kept(
    gpusched: ApiClient, jp_serverapp: Any, fields: dict[str, Any], status: int
) -> None:
    body = {"kind": "script", "command": ["true"], "uploads": [upload("data/big.bin", "y" * 4096)]}
    resp = await gpusched.request("POST", "jobs", body={**body, **fields})
    assert resp.code == status, resp.body
    users = Path(jp_serverapp.web_app.settings["gpusched_data_dir"]) / "users"
    assert not users.exists() or files_under(users) == []

    ok = await gpusched.request("POST", "jobs", body={**body, "gpus": 0, "not_before": None})
    assert ok.code == 201, ok.body
    assert [p.rsplit("/", 1)[-1] for p in files_under(users)] == ["big.bin"]


async def test_notebook_paths_that_collide_as_file_and_folder_get_409(
    gpusched: ApiClient, jp_root_dir: Path
) -> None:
    ok = await gpusched.request(
        "POST", "notebooks", body={"notebook": "q.ipynb", "content": NB, "at": "tonight"}
    )
    assert ok.code == 201, ok.body
    under = {"notebook": "q.ipynb/x.ipynb", "content": NB, "at": "tonight"}
    refused(await gpusched.request("POST", "notebooks", body=under), 409, None, "'q.ipynb' is a")

    (jp_root_dir / "d.ipynb").mkdir()
    onto = {"notebook": "d.ipynb", "content": NB, "at": "tonight"}
    refused(await gpusched.request("POST", "notebooks", body=onto), 409, None, "is a folder")
    assert (jp_root_dir / "q.ipynb").is_file() and (jp_root_dir / "d.ipynb").is_dir()


async def test_a_refused_notebook_request_leaves_the_kept_notebook_as_it_was(
    gpusched: ApiClient, jp_root_dir: Path
) -> None:
    first = {**NB, "metadata": {"v": 1}}
    ok = await gpusched.request(
        "POST", "notebooks", body={"notebook": "n/q.ipynb", "content": first, "at": "tonight"}
    )
    assert ok.code == 201, ok.body
    second = {**NB, "metadata": {"v": 2}}
    bad = {"notebook": "n/q.ipynb", "content": second, "at": "at teatime"}
    refused(await gpusched.request("POST", "notebooks", body=bad), 422, "at", "teatime")
    assert json.loads((jp_root_dir / "n" / "q.ipynb").read_text())["metadata"] == {"v": 1}

    new = {"notebook": "m/deep/r.ipynb", "content": NB, "at": "at teatime"}
    refused(await gpusched.request("POST", "notebooks", body=new), 422, "at", "teatime")
    assert not (jp_root_dir / "m").exists()
    assert sorted(p.name for p in (jp_root_dir / "n").iterdir()) == ["q.ipynb"]
