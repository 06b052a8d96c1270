"""Notebook jobs end to end: real notebooks run by nbclient on simulated nodes over real SSH."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pytest
from _fixtures_notebooks import (
    MONDAY_9AM,
    NbHarness,
    nb_harness,
    nb_sim,
    outputs_text,
    progress_cells,
    read_notebook,
    write_notebook,
)

from jupyter_gpusched.batch.notebooks import NotebookPlugin
from jupyter_gpusched.batch.requests import (
    build_submission,
    next_batch_window,
    notebook_command,
    parse_request,
    resolve_at,
)
from jupyter_gpusched.core import windows
from jupyter_gpusched.core.errors import InvalidSpecError, NotFoundError
from jupyter_gpusched.core.models import Job, JobState, parse_spec

__all__ = ["nb_harness", "nb_sim"]  # fixtures

TYPES_CELL = (
    "print({k: (type(v).__name__, v) for k, v in dict(n=n, lr=lr, name=name, flag=flag, "
    "items=items, cfg=cfg, nothing=nothing).items()})"
)
DEFAULTS = "n = 0\nlr = 0.0\nname = ''\nflag = False\nitems = []\ncfg = {}\nnothing = 1"
PARAMS = {
    "n": 3,
    "lr": 0.25,
    "name": 'it\'s "quoted"',
    "flag": True,
    "items": [1, "two", 3.5],
    "cfg": {"depth": 2, "tags": ["a"]},
    "nothing": None,
}


def output_path(h: NbHarness, job: Job) -> Path:
    return h.root / job.handle["outputs"]["notebook"]


@pytest.mark.asyncio
async def test_parameters_arrive_typed_and_the_executed_notebook_comes_back_beside_the_input(
    nb_harness: NbHarness,
) -> None:
    write_notebook(
        nb_harness.root / "exp" / "train.ipynb",
        [TYPES_CELL, "import os\nprint('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"],
        parameters=DEFAULTS,
    )
    job = nb_harness.submit(notebook="exp/train.ipynb", parameters=PARAMS, gpus=2)
    (done,) = await nb_harness.settle(job.id)

    assert done.state is JobState.SUCCEEDED, done.reason
    out = output_path(nb_harness, done)
    assert out.parent == nb_harness.root / "exp"
    stamp = done.started_at.strftime("%Y%m%d-%H%M%S")  # type: ignore[union-attr]
    assert out.name == f"train-{stamp}-job{done.id}.ipynb"
    assert (nb_harness.root / done.handle["outputs"]["log"]).name == out.with_suffix(".log").name
    nb = read_notebook(out)
    printed = outputs_text(nb.cells[3])
    assert eval(printed) == {k: (type(v).__name__, v) for k, v in PARAMS.items()}  # noqa: S307
    assert "injected-parameters" in nb.cells[2].metadata["tags"]
    assert outputs_text(nb.cells[4]).strip() == "gpus " + ",".join(done.placement.gpu_uuids)  # type: ignore[union-attr]
    assert nb.metadata["gpusched"]["status"] == "succeeded"
    assert nb.metadata["gpusched"]["parameters"] == PARAMS


@pytest.mark.asyncio
async def test_progress_events_report_each_cell_in_order_with_its_source_line(
    nb_harness: NbHarness,
) -> None:
    cells = ["a = 1", "# set up\nb = a + 1", "import time\ntime.sleep(0.3)", "print(a + b)"]
    write_notebook(nb_harness.root / "steps.ipynb", cells)
    job = nb_harness.submit(notebook="steps.ipynb")
    await nb_harness.settle(job.id)

    progress = nb_harness.events(job.id, "progress")
    assert progress_cells(progress) == [1, 2, 3, 4]
    assert [p["of"] for p in progress] == [4] * 4
    assert [p["source"] for p in progress] == ["a = 1", "b = a + 1", "import time", "print(a + b)"]
    ids = [e.id for e in nb_harness.store.list_events(job_id=job.id) if e.kind == "progress"]
    assert ids == sorted(ids)
    log = (nb_harness.root / nb_harness.job(job.id).handle["outputs"]["log"]).read_text()
    assert "##gpusched-progress" not in log and "3\n" in log  # the copy is for people


@pytest.mark.asyncio
async def test_two_servers_following_one_log_store_each_progress_line_once(
    nb_harness: NbHarness,
) -> None:
    # a second plugin on the same store stands for a second server following the same job
    other = NotebookPlugin(nb_harness.sched, nb_harness.sched.backend)
    write_notebook(nb_harness.root / "twice.ipynb", [f"x{i} = {i}" for i in range(6)])
    job = nb_harness.submit(notebook="twice.ipynb")
    await nb_harness.until(lambda: nb_harness.job(job.id).handle.get("log") is not None)
    second = asyncio.ensure_future(other._follow(job.id))
    await nb_harness.settle(job.id)
    await asyncio.wait_for(second, 30)

    assert progress_cells(nb_harness.events(job.id, "progress")) == [1, 2, 3, 4, 5, 6]


@pytest.mark.asyncio
async def test_a_failing_notebook_comes_back_with_the_failing_cell_and_its_traceback(
    nb_harness: NbHarness,
) -> None:
    write_notebook(
        nb_harness.root / "bad.ipynb",
        ["x = 1", "def boom():\n    return 1 / 0\nboom()", "print('never ran')"],
    )
    write_notebook(nb_harness.root / "slow.ipynb", ["import time\ntime.sleep(60)"])
    bad = nb_harness.submit(notebook="bad.ipynb")
    slow = nb_harness.submit(notebook="slow.ipynb", cell_timeout_s=2)
    bad_done, slow_done = await nb_harness.settle(bad.id, slow.id)

    assert (bad_done.state, bad_done.exit_code) == (JobState.FAILED, 1)
    nb = read_notebook(output_path(nb_harness, bad_done))
    banner, failing, after = nb.cells[2], nb.cells[3], nb.cells[4]
    assert banner.cell_type == "markdown" and "ZeroDivisionError" in banner.source
    assert "ZeroDivisionError" in outputs_text(failing) and "boom()" in outputs_text(failing)
    assert after.source == "print('never ran')" and after.outputs == []
    assert nb.metadata["gpusched"]["status"] == "failed"
    assert nb.metadata["gpusched"]["failed_cell"] == 2

    assert slow_done.state is JobState.FAILED
    slow_nb = read_notebook(output_path(nb_harness, slow_done))
    assert slow_nb.metadata["gpusched"]["error"]["ename"] == "CellTimeoutError"
    assert "cell timed out after 2s" in slow_nb.cells[1].source  # the banner above it
    assert "KeyboardInterrupt" in outputs_text(slow_nb.cells[2])  # nbclient interrupted it


@pytest.mark.asyncio
async def test_a_cancelled_notebook_comes_back_with_the_cells_that_ran(
    nb_harness: NbHarness,
) -> None:
    write_notebook(
        nb_harness.root / "long.ipynb",
        ["print('first done')", "import time\ntime.sleep(120)", "print('never')"],
    )
    job = nb_harness.submit(notebook="long.ipynb")
    await nb_harness.until(
        lambda: progress_cells(nb_harness.events(job.id, "progress"))[-1:] == [2]
    )
    await nb_harness.sched.cancel(job.id, user="alice")
    (done,) = await nb_harness.settle(job.id)

    assert done.state is JobState.CANCELLED
    nb = read_notebook(output_path(nb_harness, done))
    assert outputs_text(nb.cells[1]) == "first done\n"
    assert "SIGTERM" in nb.metadata["gpusched"]["error"]["evalue"]
    assert nb.cells[-1].outputs == []


@pytest.mark.asyncio
async def test_a_failed_notebook_is_retried_after_its_backoff(nb_harness: NbHarness) -> None:
    write_notebook(nb_harness.root / "flaky.ipynb", ["raise RuntimeError('flaky')"])
    first = nb_harness.submit(notebook="flaky.ipynb", retries=1, retry_backoff_s=600)
    await nb_harness.settle(first.id)
    retries = [j for j in nb_harness.sched.list_jobs(limit=10)[0] if j.id != first.id]
    assert len(retries) == 1
    again = retries[0]
    assert again.spec.labels["retry_of"] == str(first.id) and again.spec.labels["retry"] == "1"
    assert again.spec.not_before == MONDAY_9AM + timedelta(seconds=600)
    await nb_harness.sched.tick()
    assert nb_harness.job(again.id).state is JobState.QUEUED

    nb_harness.clock.advance(601)
    await nb_harness.settle(again.id)
    assert nb_harness.job(again.id).state is JobState.FAILED
    assert len(nb_harness.sched.list_jobs(limit=10)[0]) == 2  # retries=1: no third run


# ---------------------------------------------------------------------------- pure parts


def test_tonight_is_the_next_window_without_a_batch_time_limit() -> None:
    config = windows.PolicyConfig()  # day Mon-Fri 08-20 limits batch to 4 h; night does not
    assert next_batch_window(config, MONDAY_9AM) == datetime(2026, 11, 23, 20, 0, tzinfo=UTC)
    saturday = datetime(2026, 11, 28, 11, 0, tzinfo=UTC)
    assert next_batch_window(config, saturday) == saturday
    berlin = windows.PolicyConfig(timezone="Europe/Berlin")
    assert next_batch_window(berlin, MONDAY_9AM) == datetime(2026, 11, 23, 19, 0, tzinfo=UTC)


def test_at_reads_now_tonight_window_names_iso_times_and_cron() -> None:
    config = windows.PolicyConfig(timezone="Europe/Berlin")
    evening = datetime(2026, 11, 23, 19, 0, tzinfo=UTC)
    assert resolve_at("now", config, MONDAY_9AM) == (None, None)
    assert resolve_at("tonight", config, MONDAY_9AM) == (evening, None)
    assert resolve_at("night", config, MONDAY_9AM) == (evening, None)
    assert resolve_at("day", config, evening) == (datetime(2026, 11, 24, 7, 0, tzinfo=UTC), None)
    assert resolve_at("2026-11-24T03:00", config, MONDAY_9AM) == (
        datetime(2026, 11, 24, 2, 0, tzinfo=UTC),
        None,
    )
    assert resolve_at("2026-11-01T00:00+00:00", config, MONDAY_9AM) == (None, None)  # past
    assert resolve_at("0 2 * * *", config, MONDAY_9AM) == (None, "0 2 * * *")
    for bad in ("soonish", "61 * * * *"):
        with pytest.raises(InvalidSpecError) as err:
            resolve_at(bad, config, MONDAY_9AM)
        assert err.value.field in ("at", "schedule")


def test_tonight_is_refused_when_every_window_limits_batch_work() -> None:
    strict = windows.PolicyConfig(windows=(windows.Window("always", batch_max_runtime_s=3600),))
    with pytest.raises(InvalidSpecError, match="no policy window"):
        next_batch_window(strict, MONDAY_9AM)


def test_submissions_refuse_paths_outside_the_root_and_bad_parameter_names(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    write_notebook(root / "ok.ipynb", ["1"])
    write_notebook(tmp_path / "outside.ipynb", ["1"])
    config = windows.PolicyConfig()

    def submit(**body: object):  # type: ignore[no-untyped-def]
        return build_submission(
            parse_request(body), user="bob", root_dir=str(root), config=config, now=MONDAY_9AM
        )

    sub = submit(notebook=str(root / "ok.ipynb"), at="tonight", gpus=2)
    assert (sub.spec.notebook, sub.spec.files, sub.spec.user) == (
        "ok.ipynb",
        [str(root / "ok.ipynb")],
        "bob",
    )
    assert sub.spec.not_before == datetime(2026, 11, 23, 20, 0, tzinfo=UTC)
    # outputs are written beside the input: it must be in the owner's area, however named
    for outside in ("../outside.ipynb", str(tmp_path / "outside.ipynb")):
        with pytest.raises(InvalidSpecError, match="outside your root directory"):
            submit(notebook=outside)
    with pytest.raises(NotFoundError):
        submit(notebook="missing.ipynb")
    with pytest.raises(InvalidSpecError) as err:
        submit(notebook="ok.ipynb", parameters={"not a name": 1})
    assert err.value.field == "parameters.not a name"
    with pytest.raises(InvalidSpecError) as err:
        submit(notebook="ok.ipynb", kind="script")
    assert err.value.field == "kind"
    recurring = submit(notebook="ok.ipynb", at="30 2 * * *", timezone="Europe/Berlin")
    assert (recurring.schedule, recurring.timezone) == ("30 2 * * *", "Europe/Berlin")


def test_the_command_runs_nbrun_on_the_staged_copy_and_leaves_the_parameters_off_it() -> None:
    spec = parse_spec(
        {
            "kind": "notebook",
            "notebook": "exp/a b.ipynb",
            "files": ["/srv/root/exp/a b.ipynb"],
            "parameters": {"lr": 0.1},
            "kernel_name": "python3",
            "labels": {"notebook_cell_timeout_s": "30"},
        }
    )
    job = Job(id=7, spec=spec, submitted_at=MONDAY_9AM, handle={"limit_s": 3600.0})
    assert notebook_command(job, python="/opt/py/bin/python") == [
        "/opt/py/bin/python",
        "-m",
        "jupyter_gpusched.node.nbrun",
        "a b.ipynb",
        "--output",
        "a b.gpusched-out.ipynb",
        "--fallback-input",
        "/srv/root/exp/a b.ipynb",
        "--parameters-env",  # the name of the file's variable: the values stay off the line
        "GPUSCHED_PARAMETERS_FILE",
        "--kernel",
        "python3",
        "--cell-timeout-s",
        "30",
        "--job-timeout-s",
        "3595",
    ]


def test_windows_named_like_words_are_resolved_by_name() -> None:
    config = windows.PolicyConfig(
        windows=(
            windows.Window("lunch", start=time(12, 0), end=time(13, 0)),
            windows.Window("rest"),
        )
    )
    assert resolve_at("lunch", config, MONDAY_9AM) == (
        datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
        None,
    )
