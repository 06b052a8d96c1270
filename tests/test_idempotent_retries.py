"""A create whose answer is lost is retried with its ``Idempotency-Key`` and makes one job:
through a proxy that cuts the connection after the commit, across a kill -9 and restart, under
a kill -9 storm, and on another service sharing the store; the CLI and the magic send keys."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import wait_for
from _fixtures_retrying import (
    SUBMIT_LABEL,
    DroppingProxy,
    RetryingReport,
    retrying_submits,
    tagged_jobs,
)
from _fixtures_server import FAR_FUTURE, ServerProcess
from _fixtures_service import ServiceProcess, client_server

from jupyter_gpusched.client.api import GpuSchedClient, ServerNotFoundError

pytestmark = pytest.mark.slow

JOB = {"kind": "script", "command": ["true"], "gpus": 0, "not_before": FAR_FUTURE}


def labelled(tag: str, i: int = 0, **extra: Any) -> dict[str, Any]:
    return {**JOB, "labels": {SUBMIT_LABEL: f"{tag}:{i}"}, **extra}


class Service(ServiceProcess):
    """The service, remembering its store's URL (the tests read the store directly)."""

    def __init__(self, root: Path, *, store_url: str) -> None:
        super().__init__(root, store_url=store_url)
        self.store_url = store_url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    """The lab's service on a SQLite file or a PostgreSQL database; ``store_url`` says which."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'service.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    svc = Service(tmp_path / "service", store_url=url).start()
    try:
        yield svc
    finally:
        svc.stop()


def restart_after_kill_9(svc: ServiceProcess) -> None:
    svc.stop(sig=signal.SIGKILL)
    svc.start()


def test_a_submit_whose_answer_is_cut_off_is_retried_and_makes_one_job(
    service: Service,
) -> None:
    with DroppingProxy(service.port) as proxy:
        client = GpuSchedClient(proxy.url, service.admin_token)
        proxy.drop_next_answers(1)
        job = client.submit(labelled("cut"))
        assert (proxy.dropped, proxy.posts) == (1, 2)  # the first answer never came
        proxy.drop_next_answers(1)
        array = client.submit_array(3, labelled("cut", 1))
        assert (proxy.dropped, proxy.posts) == (2, 4)
    per_label, ids = tagged_jobs(service.store_url, "cut")
    assert (array.size, array.pending) == (3, 2)  # one record: task 0 and 2 pending
    assert ids == {job.id, array.array_id}
    assert per_label == {"cut:0": 1, "cut:1": 1}


def test_a_submit_cut_by_kill_9_after_its_commit_is_answered_by_the_restarted_service(
    service: Service,
) -> None:
    with DroppingProxy(service.port) as proxy:
        client = GpuSchedClient(proxy.url, service.admin_token)
        proxy.drop_next_answers(1, then=lambda: restart_after_kill_9(service))
        job = client.submit(labelled("killed"))
        assert proxy.dropped == 1
    _, ids = tagged_jobs(service.store_url, "killed")
    assert ids == {job.id}
    listed = service.api("GET", "jobs?limit=100", token=service.admin_token)["jobs"]
    assert [j["id"] for j in listed] == [job.id]


def test_a_retrying_client_under_a_kill_9_storm_makes_each_job_once(service: Service) -> None:
    jobs, report = 24, RetryingReport(jobs=0)
    proxy = DroppingProxy(service.port)  # no answer while the service restarts

    def submit() -> None:
        nonlocal report
        report = retrying_submits(
            proxy.url, service.admin_token, jobs=jobs, store_url=service.store_url, spec=JOB
        )

    worker = threading.Thread(target=submit)
    worker.start()
    try:
        for stored in (4, 12):  # kill -9 while submits are under way, twice
            wait_for(
                lambda n=stored: sum(tagged_jobs(service.store_url, "chaos")[0].values()) >= n,
                timeout_s=120,
                what=f"{stored} jobs submitted",
            )
            with proxy.shut():
                restart_after_kill_9(service)
    finally:
        worker.join(300)
        proxy.close()
    assert not worker.is_alive()
    assert report.clean, report
    assert len(set(report.ids)) == jobs


@pytest.mark.postgres
def test_a_key_sent_to_a_killed_service_is_answered_by_the_other_on_the_store(
    tmp_path: Path, postgres_url: str
) -> None:
    first = ServiceProcess(tmp_path / "a", store_url=postgres_url).start()
    second = ServiceProcess(tmp_path / "b", store_url=postgres_url)
    second.admin_token = first.admin_token  # one store: one token works on both
    try:
        second.start()
        key, body = str(uuid.uuid4()), labelled("failover")
        with DroppingProxy(first.port) as proxy:
            proxy.drop_next_answers(1, then=lambda: first.stop(sig=signal.SIGKILL))
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                post(proxy.url, first.admin_token, body, key)
        status, answer, headers = post(second.url, first.admin_token, body, key)
        assert status == 201 and headers["Idempotent-Replayed"] == "true"
        _, ids = tagged_jobs(postgres_url, "failover")
        assert ids == {answer["id"]}
        assert headers["Location"].endswith(f"/gpusched/api/jobs/{answer['id']}")
    finally:
        first.stop()
        second.stop()


def post(url: str, token: str, body: Any, key: str) -> tuple[int, Any, Any]:
    req = urllib.request.Request(
        url + "gpusched/api/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"token {token}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        },
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read()), resp.headers


def test_without_retries_a_cut_submit_is_an_error_not_a_second_job(service: Service) -> None:
    with DroppingProxy(service.port) as proxy:
        proxy.drop_next_answers(1)
        with pytest.raises(ServerNotFoundError, match="cannot reach"):
            GpuSchedClient(proxy.url, service.admin_token, post_tries=1).submit(labelled("once"))
    assert len(tagged_jobs(service.store_url, "once")[1]) == 1  # it was made: retry it


def test_a_users_server_in_client_mode_passes_the_key_to_the_service(
    tmp_path: Path,
) -> None:
    service = Service(tmp_path / "service", store_url=f"sqlite:///{tmp_path / 's.db'}").start()
    alice = client_server(tmp_path / "alice", service, service.mint("alice"))
    try:
        alice.start()
        key, body = str(uuid.uuid4()), labelled("forwarded")
        first = post(alice.url, alice.token, body, key)
        again = post(alice.url, alice.token, body, key)
        assert first[1]["id"] == again[1]["id"] and first[1]["user"] == "alice"
        assert again[2]["Idempotent-Replayed"] == "true"
        assert again[2]["Location"] == first[2]["Location"]
        assert tagged_jobs(service.store_url, "forwarded")[1] == {first[1]["id"]}
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(alice.url, alice.token, body, "bad\u0001key")
        assert refused.value.code == 400
        refused.value.close()
    finally:
        alice.stop()
        service.stop()


# -- the CLI and the magic --------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("keys")).start()
    yield srv
    srv.stop()


def server_jobs(server: ServerProcess, name: str) -> list[int]:
    client = GpuSchedClient(server.url, server.token)
    return [j.id for j in client.list_jobs(limit=1000).jobs if j.spec.name == name]


def test_the_cli_retries_a_cut_submit_with_its_key(
    server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_gpusched.cli import app as cli

    with DroppingProxy(server.port) as proxy:
        proxy.drop_next_answers(1)
        argv = ["submit", "--url", proxy.url, "--token", server.token, "--name", "by-cli"]
        code = cli.main([*argv, "--at", FAR_FUTURE, "--", "true"])
        out, err = capsys.readouterr()
        assert (code, err) == (0, ""), out
        assert proxy.dropped == 1
    (job_id,) = server_jobs(server, "by-cli")
    assert str(job_id) in out


def test_the_magic_retries_a_cut_submit_with_its_key(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from IPython.testing.globalipapp import get_ipython, start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jupyter_gpusched")
    work = server.root / "magic"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    with DroppingProxy(server.port) as proxy:
        with capture_output() as said:
            assert shell.run_cell(f"%gpu config --url {proxy.url} --token {server.token}").success
        proxy.drop_next_answers(1)
        with capture_output() as said:
            result = shell.run_cell("%gpu submit job.py --gpus 0 --name by-magic")
        assert result.success, said.stderr
        assert proxy.dropped == 1
    (job_id,) = server_jobs(server, "by-magic")
    assert said.stdout.startswith(f"%gpu: submitted job {job_id} ")
