"""``Idempotency-Key`` on the creates of a live Jupyter server: a repeat gets the first answer,
never a second job; another request with the key, a malformed key, a repeat in flight are
refused saying what to do."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _fixtures_notebooks import write_notebook
from _fixtures_server import FAR_FUTURE, conforms

from jupyter_gpusched.core.models import parse_spec
from jupyter_gpusched.server.idempotency import fingerprint
from jupyter_gpusched.store.idempotency import KeyClaim

if TYPE_CHECKING:
    from _fixtures_server import ApiClient

JOB = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def scheduler(jp_serverapp: Any) -> Any:
    return jp_serverapp.web_app.settings["gpusched"]


def stored_jobs(jp_serverapp: Any, user: str = "alice") -> list[int]:
    jobs, _ = scheduler(jp_serverapp).store.list_jobs(user=user, limit=None)
    return [job.id for job in jobs]


def made_by(job: dict[str, Any]) -> tuple[Any, ...]:
    """What a job's answer says about what its request made (its state moves on)."""
    return job["id"], job["user"], job["spec"], job["submitted_at"]


def error(resp: Any, status: int, name: str) -> dict[str, Any]:
    assert resp.code == status, (resp.code, resp.body)
    body = conforms(json.loads(resp.body), "Error")
    assert body["error"] == name, body
    return body


async def test_a_repeated_submit_gets_the_first_answer_and_makes_no_second_job(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    first = await gpusched.request("POST", "jobs", body=JOB, headers=keyed('"k-1"'))
    again = await gpusched.request("POST", "jobs", body=JOB, headers=keyed("k-1"))  # bare too
    assert (first.code, again.code) == (201, 201), again.body
    made, replayed = json.loads(first.body), conforms(json.loads(again.body), "Job")
    assert made_by(replayed) == made_by(made)  # the same job, shown as it is now
    assert again.headers["Location"] == first.headers["Location"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert stored_jobs(jp_serverapp) == [made["id"]]

    other = await gpusched.request("POST", "jobs", body=JOB, headers=keyed("k-2"))
    unkeyed = await gpusched.request("POST", "jobs", body=JOB)
    assert len({made["id"], json.loads(other.body)["id"], json.loads(unkeyed.body)["id"]}) == 3


async def test_keys_are_each_callers_own(gpusched: ApiClient, jp_serverapp: Any) -> None:
    alice = await gpusched.submit(**JOB)  # no key: a job of alice's to tell ids apart
    mine = await gpusched.request("POST", "jobs", body=JOB, headers=keyed("shared"))
    bobs = await gpusched.as_user("bob").request("POST", "jobs", body=JOB, headers=keyed("shared"))
    assert (mine.code, bobs.code) == (201, 201)
    mine_job, bobs_job = json.loads(mine.body), json.loads(bobs.body)
    assert (mine_job["user"], bobs_job["user"]) == ("alice", "bob")
    assert len({alice["id"], mine_job["id"], bobs_job["id"]}) == 3
    assert stored_jobs(jp_serverapp, "bob") == [bobs_job["id"]]


async def test_a_repeated_array_or_list_returns_the_same_array(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    for body in ({**JOB, "array": 3}, [JOB, {**JOB, "gpus": 2}]):
        key = keyed(f"bulk-{type(body).__name__}")
        first = await gpusched.request("POST", "jobs", body=body, headers=key)
        again = await gpusched.request("POST", "jobs", body=body, headers=key)
        assert (first.code, again.code) == (201, 201), again.body
        made = json.loads(first.body)
        replayed = conforms(json.loads(again.body), "JobArray")
        assert replayed["array_id"] == made["array_id"]
        assert [j["id"] for j in replayed["jobs"]] == [j["id"] for j in made["jobs"]]
        assert again.headers["Location"] == first.headers["Location"]
    # the array is one record and its task 0 (its tasks wait for a far time), the list 2 jobs
    assert len(stored_jobs(jp_serverapp)) == 3
    (array,) = scheduler(jp_serverapp).store.list_arrays(user="alice")
    assert (array.size, array.pending) == (3, 2)


async def test_the_same_key_with_another_request_is_refused_with_422(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    assert (await gpusched.request("POST", "jobs", body=JOB, headers=keyed("k"))).code == 201
    changed = await gpusched.request("POST", "jobs", body={**JOB, "gpus": 2}, headers=keyed("k"))
    body = error(changed, 422, "InvalidSpecError")
    assert body["field"] == "Idempotency-Key"
    assert "used for another request" in body["message"] and "new key" in body["message"]
    assert len(stored_jobs(jp_serverapp)) == 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "is empty"),
        ('""', "is empty"),
        ("x" * 256, "256 characters long"),
        ("tab\there", "the character '\\t'"),
        ("caf\u00e9", "the character"),
    ],
)
async def test_a_malformed_key_is_refused_with_400_saying_what_to_send(
    gpusched: ApiClient, jp_serverapp: Any, value: str, says: str
) -> None:
    resp = await gpusched.request("POST", "jobs", body=JOB, headers=keyed(value))
    body = error(resp, 400, "BadRequestError")
    assert says in body["message"] and "e.g. a UUID" in body["message"], body
    assert stored_jobs(jp_serverapp) == []


async def test_a_repeat_while_the_array_is_still_being_written_gets_409_with_retry_after(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    body = {**JOB, "array": 600}
    raw = json.dumps(body).encode()
    sched = scheduler(jp_serverapp)
    # The first submit's first transaction (its head and key) committed; its chunks are not
    # written yet, as when another server is still writing them, or was killed meanwhile.
    claim = KeyClaim("alice", "big", fingerprint("jobs", raw))
    spec = parse_spec({**JOB, "user": "alice"})
    await asyncio.to_thread(sched.store.add_array_head, spec, claim)
    resp = await gpusched.request("POST", "jobs", raw_body=raw, headers=keyed("big"))
    error(resp, 409, "InFlightError")
    assert resp.headers["Retry-After"] == "1"
    assert len(stored_jobs(jp_serverapp)) == 1


async def test_concurrent_repeats_of_a_big_array_make_one_array(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    body = {**JOB, "gpus": 0, "array": 100_000}  # one record, however big
    answers = await asyncio.gather(
        *(gpusched.request("POST", "jobs", body=body, headers=keyed("race")) for _ in range(3))
    )
    assert sorted(r.code for r in answers)[0] == 201
    assert {r.code for r in answers} <= {201, 409}, [(r.code, r.body) for r in answers]
    arrays = {json.loads(r.body)["array_id"] for r in answers if r.code == 201}
    assert len(arrays) == 1 and len(stored_jobs(jp_serverapp)) == 1  # its task 0
    (array,) = scheduler(jp_serverapp).store.list_arrays(user="alice")
    assert (array.id, array.size) == (arrays.pop(), 100_000)


async def test_notebook_jobs_and_definitions_are_made_once_per_key(
    gpusched: ApiClient, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    write_notebook(jp_root_dir / "nb.ipynb", ["print(1)"])
    cases = [
        ("notebooks", {"notebook": "nb.ipynb", "at": FAR_FUTURE}, "NotebookSubmitted"),
        ("notebooks", {"notebook": "nb.ipynb", "at": "0 3 * * *"}, "NotebookSubmitted"),
        ("definitions", {"notebook": "nb.ipynb", "schedule": "0 4 * * *"}, "Definition"),
    ]
    for i, (route, body, schema) in enumerate(cases):
        first = await gpusched.request("POST", route, body=body, headers=keyed(f"nb{i}"))
        again = await gpusched.request("POST", route, body=body, headers=keyed(f"nb{i}"))
        assert (first.code, again.code) == (201, 201), again.body
        made, replayed = json.loads(first.body), conforms(json.loads(again.body), schema)
        if made.get("job") or replayed.get("job"):
            assert made_by(replayed["job"]) == made_by(made["job"])
        else:
            assert replayed.get("definition", replayed) == made.get("definition", made)
        assert again.headers["Location"] == first.headers["Location"]
    definitions = await gpusched.json("GET", "definitions")
    assert definitions["total"] == 2 and len(stored_jobs(jp_serverapp)) == 1
    # a key is for one route: the notebook job's key on another route is another request
    reused = await gpusched.request("POST", "definitions", body=cases[0][1], headers=keyed("nb0"))
    error(reused, 422, "InvalidSpecError")
