"""The JupyterLab panel, end to end: real ``jupyter lab``, embedded cluster, headless chromium.

Every test saves a screenshot to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import (
    SIM_NODES,
    LabServer,
    notebook,
    open_lab,
    screenshot,
    show_sidebar,
    start_lab,
    stop_lab,
)
from _lab_steps import page_call

# The fixtures, made visible to this module's tests.
chromium = _fixtures_lab.chromium
lab_server = _fixtures_lab.lab_server
lab_page = _fixtures_lab.lab_page
pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_TIMEOUT_MS = 90_000
#: Colours of src/colors.ts as the browser reports them.
RGB = {
    "free": "rgb(224, 224, 224)",
    "batch": "rgb(21, 101, 192)",
}


def submit_from_file_browser(
    page: Any, name: str, gpus: int, mem_gb: int | None = None, parameters: str = ""
) -> int:
    """Right-click ``name`` in the file browser, submit it, and return the new job's id."""
    show_sidebar(page, "filebrowser")
    item = page.locator(".jp-DirListing-item", has_text=name).first
    item.wait_for(state="visible")
    item.click(button="right")
    page.locator(".lm-Menu-item", has_text="Submit to GPU Queue").click()
    return fill_submit_dialog(page, gpus, mem_gb, parameters)


def fill_submit_dialog(
    page: Any, gpus: int, mem_gb: int | None, parameters: str = "", cron: str | None = None
) -> int:
    """Fill the submit dialog, press Submit, and return the id the toast announces.

    Without ``cron`` that is the new job's id; with it, the new schedule's.
    """
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input[name=gpus]").fill(str(gpus))
    if mem_gb is not None:
        dialog.locator("input[name=gpu_mem_gb]").fill(str(mem_gb))
    dialog.locator("textarea[name=parameters]").fill(parameters)
    if cron is not None:
        dialog.locator("input[name=cron]").fill(cron)
        assert dialog.locator("input[name=when][value=cron]").is_checked()
    screenshot(page, "lab-submit-dialog-cron" if cron else "lab-submit-dialog")
    dialog.locator(".jp-mod-accept").click()
    announced = "as schedule #" if cron else "as GPU job #"
    toast = page.locator(".Toastify__toast", has_text=announced).last
    toast.wait_for(state="visible")
    match = re.search(r"(?:GPU job|schedule) #(\d+)", toast.inner_text())
    assert match, toast.inner_text()
    show_sidebar(page, "gpusched-panel")
    return int(match.group(1))


def output_notebook(server: LabServer, job_id: int) -> Path:
    """The executed notebook the server named in the finished job's outputs."""
    outputs = server.api(f"gpusched/api/jobs/{job_id}")["outputs"]
    assert outputs and outputs["notebook"], outputs
    return server.root / outputs["notebook"]


def close_tab(page: Any, name: str) -> None:
    """Close the main-area tab titled ``name``, discarding changes (the kernel may mark it)."""
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    page.wait_for_function(
        "name => document.querySelector('.jp-Dialog') || ![...document.querySelectorAll("
        "'.lm-DockPanel-tabBar .lm-TabBar-tab')].some(t => t.textContent.includes(name))",
        arg=name,
    )
    if page.locator(".jp-Dialog").count():
        page.locator(".jp-Dialog button", has_text="Discard").click()
    tab.wait_for(state="detached")


def queue_row(page: Any, job_id: int) -> Any:
    return page.locator(
        f'#gpusched-panel .jp-gpusched-queue .jp-gpusched-job-row[data-job-id="{job_id}"]'
    )


def test_panel_shows_every_node_and_gpu(lab_page: Any) -> None:
    page = lab_page
    page.wait_for_selector(".jp-gpusched-node")
    nodes = page.locator("#gpusched-panel .jp-gpusched-node")
    names = [nodes.nth(i).get_attribute("data-node") for i in range(nodes.count())]
    assert names == list(SIM_NODES)
    for name, gpus in SIM_NODES.items():
        cells = page.locator(f'.jp-gpusched-node[data-node="{name}"] .jp-gpusched-gpu')
        assert cells.count() == gpus
    first = page.locator('.jp-gpusched-gpu[data-gpu="a100-0/0"]')
    assert first.get_attribute("data-state") == "free"
    assert first.evaluate("e => getComputedStyle(e).backgroundColor") == RGB["free"]
    assert first.get_attribute("title").startswith("a100-0 GPU 0 · A100-80GB · free\nmemory ")
    legend = page.locator(".jp-gpusched-legend").inner_text()
    for word in ("free", "interactive", "batch", "foreign use", "down"):
        assert word in legend
    assert "22/22 GPUs free" in page.locator(".jp-gpusched-figures").inner_text()
    assert re.search(r"\w+ window", page.locator(".jp-gpusched-window").inner_text())
    assert "You have no jobs" in page.locator(".jp-gpusched-queue").inner_text()
    page.wait_for_selector(".jp-gpusched-live.jp-mod-live")
    screenshot(page, "lab-panel-cluster-map")


def test_submitted_notebook_runs_finishes_and_notifies(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    (lab_server.root / "hello.ipynb").write_text(
        notebook('import time\nprint("hello from the GPU queue")\ntime.sleep(4)')
    )
    job_id = submit_from_file_browser(page, "hello.ipynb", gpus=2, mem_gb=8)

    row = queue_row(page, job_id)
    row.wait_for(state="visible")
    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="running"]',
        timeout=RUN_TIMEOUT_MS,
    )
    # While it runs, its GPUs are drawn as batch on the map, live from the events.
    page.wait_for_selector('.jp-gpusched-gpu[data-state="batch"]')
    batch = page.locator('.jp-gpusched-gpu[data-state="batch"]')
    assert batch.count() == 2
    assert batch.first.evaluate("e => getComputedStyle(e).backgroundColor") == RGB["batch"]
    assert f"job #{job_id}" in batch.first.get_attribute("title")
    node = row.locator(".jp-gpusched-where").inner_text()
    assert re.fullmatch(r"[a-z0-9-]+: \d+,\d+", node)
    assert row.locator(".jp-gpusched-size").inner_text() == "2 GPUs × 8G"
    screenshot(page, "lab-panel-job-running")

    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="succeeded"]',
        timeout=RUN_TIMEOUT_MS,
    )
    toast = page.locator(".Toastify__toast", has_text=f"GPU job #{job_id} (hello.ipynb) succeeded")
    toast.wait_for(state="visible")
    page.wait_for_timeout(800)  # let the toast finish sliding in, for the picture only
    screenshot(page, "lab-panel-job-succeeded-notification")
    page.wait_for_selector('.jp-gpusched-gpu[data-state="batch"]', state="detached")
    output = output_notebook(lab_server, job_id)
    assert output.parent == lab_server.root, "the executed notebook lands beside the input"
    assert re.fullmatch(rf"hello-\d{{8}}-\d{{6}}-job{job_id}\.ipynb", output.name)
    assert "hello from the GPU queue" in output.read_text()

    # The notice opens the executed notebook in JupyterLab, and so does the job's row.
    toast.locator("button", has_text="Open notebook").click()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=output.name)
    tab.wait_for(state="visible")
    page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").filter(
        has_text="hello from the GPU queue"
    ).first.wait_for(state="visible")
    screenshot(page, "lab-executed-notebook-opened")
    close_tab(page, output.name)
    show_sidebar(page, "gpusched-panel")
    row.locator(".jp-gpusched-output-button").click()
    tab.wait_for(state="visible")
    close_tab(page, output.name)

    queue_row(page, job_id).locator(".jp-gpusched-log-button").click()
    log = page.locator(f"#gpusched-log-{job_id}")
    log.wait_for(state="visible")
    page.wait_for_function(
        "id => document.querySelector(`#gpusched-log-${id} .jp-gpusched-log-text`)"
        "?.textContent.includes('hello from the GPU queue')",
        arg=job_id,
    )
    header = log.locator(".jp-gpusched-log-header")
    page.wait_for_function(
        "id => document.querySelector(`#gpusched-log-${id} .jp-gpusched-log-header`)"
        "?.dataset.state === 'succeeded'",
        arg=job_id,
    )
    assert "exit code 0" in header.inner_text()
    screenshot(page, "lab-job-log")


def test_cancel_a_running_job_from_the_notebook_toolbar(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    (lab_server.root / "sleepy.ipynb").write_text(notebook("import time\ntime.sleep(600)"))
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="sleepy.ipynb").first.dblclick()
    button = page.locator(".jp-NotebookPanel:visible .jp-gpusched-submit-button")
    button.wait_for(state="visible")
    button.click()
    job_id = fill_submit_dialog(page, gpus=1, mem_gb=None)

    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="running"]',
        timeout=RUN_TIMEOUT_MS,
    )
    # Its log streams while it runs: the runner marks the cell it starts (which then sleeps),
    # and the view shows that mark as a status line, not as raw log text.
    queue_row(page, job_id).locator(".jp-gpusched-log-button").click()
    page.wait_for_function(
        "id => document.querySelector(`#gpusched-log-${id} .jp-gpusched-log-progress`)"
        "?.textContent === 'cell 1 of 1: import time'",
        arg=job_id,
    )
    text = page.locator(f"#gpusched-log-{job_id} .jp-gpusched-log-text").inner_text()
    assert "##gpusched-progress" not in text
    header = page.locator(f"#gpusched-log-{job_id} .jp-gpusched-log-header")
    assert header.get_attribute("data-state") == "running"
    screenshot(page, "lab-panel-before-cancel")
    show_sidebar(page, "gpusched-panel")
    queue_row(page, job_id).locator(".jp-gpusched-cancel").click()
    page.locator(".jp-Dialog .jp-mod-accept", has_text="Cancel job").click()
    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="cancelled"]',
        timeout=RUN_TIMEOUT_MS,
    )
    assert queue_row(page, job_id).locator(".jp-gpusched-cancel").count() == 0
    assert lab_server.api(f"gpusched/api/jobs/{job_id}")["state"] == "cancelled"
    # The log view sees its stream end and says how the job ended.
    page.wait_for_function(
        "id => document.querySelector(`#gpusched-log-${id} .jp-gpusched-log-header`)"
        "?.dataset.state === 'cancelled'",
        arg=job_id,
    )
    screenshot(page, "lab-panel-cancelled")


def test_failed_notebook_raises_an_error_notification(lab_page: Any, lab_server: LabServer) -> None:
    page = lab_page
    (lab_server.root / "broken.ipynb").write_text(notebook('raise RuntimeError("no GPU luck")'))
    job_id = submit_from_file_browser(page, "broken.ipynb", gpus=1)
    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="failed"]',
        timeout=RUN_TIMEOUT_MS,
    )
    toast = page.locator(".Toastify__toast", has_text=f"GPU job #{job_id} (broken.ipynb) failed")
    toast.wait_for(state="visible")
    assert "exit code 1" in toast.inner_text()
    assert toast.locator("button", has_text="Show log").is_visible()
    # The executed notebook keeps the traceback, and the notice offers it.
    assert toast.locator("button", has_text="Open notebook").is_visible()
    assert "no GPU luck" in output_notebook(lab_server, job_id).read_text()
    page.wait_for_timeout(800)  # let the toast finish sliding in, for the picture only
    screenshot(page, "lab-panel-job-failed-notification")


def test_all_tab_lists_everyones_jobs(lab_page: Any, lab_server: LabServer) -> None:
    page = lab_page
    total = lab_server.api("gpusched/api/jobs")["total"]
    page.locator('.jp-gpusched-tab[data-scope="all"]').click()
    rows = page.locator("#gpusched-panel .jp-gpusched-queue .jp-gpusched-job-row")
    rows.first.wait_for(state="visible")
    assert rows.count() == total
    screenshot(page, "lab-panel-all-jobs")


def test_panel_says_how_to_enable_the_server_extension(chromium: Any, tmp_path: Path) -> None:
    server = start_lab(
        tmp_path,
        server_config={"ServerApp": {"jpserver_extensions": {"jupyter_gpusched": False}}},
        wait_for_cluster=False,
    )
    try:
        page = open_lab(chromium, server)
        error = page.locator("#gpusched-panel .jp-gpusched-error")
        error.wait_for(state="visible")
        assert "jupyter server extension enable jupyter_gpusched" in error.inner_text()
        assert page.locator("#gpusched-panel .jp-gpusched-retry").is_visible()
        screenshot(page, "lab-panel-extension-off")
        page.context.close()
    finally:
        stop_lab(server)


def test_parameters_reach_the_notebook(lab_page: Any, lab_server: LabServer) -> None:
    page = lab_page
    (lab_server.root / "sweep.ipynb").write_text(notebook('print(f"lr={lr} tag={tag}")'))
    job_id = submit_from_file_browser(page, "sweep.ipynb", gpus=1, parameters="lr=0.25\ntag=a b")
    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="succeeded"]',
        timeout=RUN_TIMEOUT_MS,
    )
    assert "lr=0.25 tag=a b" in output_notebook(lab_server, job_id).read_text()
    screenshot(page, "lab-panel-parameters-run")


def test_cron_schedule_is_listed_paused_resumed_and_deleted(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    (lab_server.root / "nightly.ipynb").write_text(notebook('print("nightly")'))
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="nightly.ipynb").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Submit to GPU Queue").click()
    def_id = fill_submit_dialog(page, gpus=2, mem_gb=16, parameters="lr=0.5", cron="0 22 * * 1-5")

    stored = lab_server.api(f"gpusched/api/definitions/{def_id}")
    assert stored["schedule"] == "0 22 * * 1-5"
    assert stored["spec"]["notebook"] == "nightly.ipynb"
    assert stored["spec"]["parameters"] == {"lr": 0.5}
    assert (stored["spec"]["gpus"], stored["spec"]["gpu_mem_gb"]) == (2, 16)
    browser_tz = page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    assert stored["timezone"] == browser_tz

    row = page.locator(
        f'#gpusched-panel .jp-gpusched-definition-row[data-definition-id="{def_id}"]'
    )
    row.wait_for(state="visible")
    assert row.locator(".jp-gpusched-job").inner_text() == "nightly.ipynb"
    assert row.locator(".jp-gpusched-cron").inner_text() == "0 22 * * 1-5"
    assert row.locator(".jp-gpusched-tz").inner_text() == browser_tz
    assert re.fullmatch(
        r"weekdays at 22:00, next (\w{3} )?22:00", row.locator(".jp-gpusched-next").inner_text()
    )
    assert row.locator(".jp-gpusched-size").inner_text() == "2 GPUs × 16G"
    screenshot(page, "lab-panel-schedule-listed")

    row.locator(".jp-gpusched-pause", has_text="pause").click()
    page.wait_for_selector(
        f'.jp-gpusched-definition-row[data-definition-id="{def_id}"][data-paused="true"]'
    )
    assert row.locator(".jp-gpusched-next").inner_text() == "paused"
    assert lab_server.api(f"gpusched/api/definitions/{def_id}")["paused"] is True
    screenshot(page, "lab-panel-schedule-paused")
    row.locator(".jp-gpusched-pause", has_text="resume").click()
    page.wait_for_selector(
        f'.jp-gpusched-definition-row[data-definition-id="{def_id}"][data-paused="false"]'
    )
    assert lab_server.api(f"gpusched/api/definitions/{def_id}")["paused"] is False

    row.locator(".jp-gpusched-delete").click()
    page.locator(".jp-Dialog .jp-mod-accept", has_text="Delete").click()
    row.wait_for(state="detached")
    assert "No schedules" in page.locator("#gpusched-panel .jp-gpusched-schedules").inner_text()
    mine = lab_server.api("gpusched/api/definitions")["definitions"]
    assert def_id not in [d["id"] for d in mine]
    screenshot(page, "lab-panel-schedule-deleted")


def test_waiting_job_says_why_and_when_and_pages_show_timeline_and_gpu_history(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    page.wait_for_selector(".jp-gpusched-live.jp-mod-live")  # following events before we act
    # Both 8-GPU nodes busy for up to 20 minutes: an 8-GPU job must wait for one of them.
    hold = {"kind": "script", "command": ["sleep", "600"], "gpus": 8, "max_runtime_s": 1200}
    jobs = [page_call(page, lab_server, "POST", "gpusched/api/jobs", hold)["id"] for _ in range(2)]
    try:
        for job_id in jobs:
            page.wait_for_selector(
                f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="running"]',
                timeout=RUN_TIMEOUT_MS,
            )
        eight = {"kind": "script", "command": ["true"], "gpus": 8, "name": "eight-gpus"}
        waiting = page_call(page, lab_server, "POST", "gpusched/api/jobs", eight)["id"]
        jobs.append(waiting)
        row = queue_row(page, waiting)
        eta = row.locator(".jp-gpusched-eta")
        eta.wait_for(state="visible")
        page.wait_for_function(
            "id => document.querySelector(`.jp-gpusched-job-row[data-job-id='${id}'] "
            ".jp-gpusched-eta`)?.textContent.startsWith('starts in ')",
            arg=waiting,
            timeout=RUN_TIMEOUT_MS,
        )
        # Expected when the first holder's declared 20 minutes are up, as a local clock time:
        # declared limits, so that is the latest it starts.
        assert re.fullmatch(
            r"starts in (19m|20m)(\d+s)? \(\d\d:\d\d\) at the latest", eta.inner_text()
        )
        assert eta.get_attribute("title") == "from declared runtime limits; the latest is firm"
        assert row.locator(".jp-gpusched-position").inner_text() == "1st in line"
        reason = row.locator(".jp-gpusched-reason").inner_text()
        assert "GPU" in reason and "window" not in reason, reason
        assert "a100-0 0" in reason and "a100-1 0" in reason, reason
        figures = page.locator("#gpusched-panel .jp-gpusched-fragmentation").inner_text()
        assert figures.startswith("largest job that fits now: 4 GPUs"), figures
        assert queue_row(page, jobs[1]).get_attribute("data-state") == "running"
        screenshot(page, "lab-panel-waiting-why-and-when")

        # The map: hovering a GPU of a job marks all 8 of its GPUs; a click opens its page.
        cell = page.locator(f'#gpusched-panel .jp-gpusched-gpu[data-jobs="{jobs[0]}"]').first
        cell.hover()
        marked = page.locator("#gpusched-panel .jp-gpusched-gpu.jp-mod-highlight")
        assert marked.count() == 8
        assert {marked.nth(i).get_attribute("data-jobs") for i in range(8)} == {str(jobs[0])}
        assert marked.first.evaluate("e => getComputedStyle(e).backgroundColor") == RGB["batch"]
        screenshot(page, "lab-panel-map-hover-job")
        cell.click()
        running = page.locator(f"#gpusched-job-{jobs[0]}")
        running.locator(".jp-gpusched-page-head h2").wait_for(state="visible")
        assert "running" in running.locator(".jp-gpusched-page-head").inner_text()
        timeline = running.locator(".jp-gpusched-timeline li")
        timeline.first.wait_for(state="visible")
        steps = [timeline.nth(i).inner_text() for i in range(timeline.count())]
        assert any("submitted" in t for t in steps), steps
        assert any("→ running" in t for t in steps), steps
        # Its GPUs' utilization and memory over its life, drawn from the kept samples.
        page.wait_for_function(
            "id => document.querySelectorAll(`#gpusched-job-${id} .jp-gpusched-chart polyline`)"
            ".length >= 2",
            arg=jobs[0],
            timeout=RUN_TIMEOUT_MS,
        )
        charts = running.locator(".jp-gpusched-chart figcaption")
        assert [charts.nth(i).inner_text() for i in range(2)] == ["utilization", "memory used"]
        assert "node" in running.locator(".jp-gpusched-page-where").inner_text()
        screenshot(page, "lab-job-page-running")

        # The waiting job's page says why and until when, and its timeline starts at submit.
        show_sidebar(page, "gpusched-panel")
        row.locator("a.jp-gpusched-job").click()
        page_w = page.locator(f"#gpusched-job-{waiting}")
        page_w.locator(".jp-gpusched-page-head h2").wait_for(state="visible")
        why = page_w.locator(".jp-gpusched-page-why")
        why.locator(".jp-gpusched-reason").wait_for(state="visible")
        assert "1st in line" in why.inner_text() and "starts in " in why.inner_text()
        assert why.locator(".jp-gpusched-reason").inner_text() == reason
        assert "submitted" in page_w.locator(".jp-gpusched-timeline").inner_text()
        assert "eight-gpus" in page_w.locator(".jp-gpusched-page-head").inner_text()
        screenshot(page, "lab-job-page-waiting")

        # The wide dashboard: the map beside every node's GPU charts.
        show_sidebar(page, "gpusched-panel")
        page.locator("#gpusched-panel .jp-gpusched-open-dashboard").click()
        dash = page.locator("#gpusched-dashboard")
        dash.wait_for(state="visible")
        dash.locator('.jp-gpusched-history-node[data-node="a100-0"]').wait_for(state="visible")
        assert dash.locator(".jp-gpusched-gpu").count() == sum(SIM_NODES.values())
        screenshot(page, "lab-dashboard")
    finally:
        # The waiting job first: cancelling a holder first frees the GPUs it waits for, and it
        # could then run and end before its own cancel (a 409).
        for job_id in reversed(jobs):
            page_call(page, lab_server, "DELETE", f"gpusched/api/jobs/{job_id}")


def test_submit_dialog_saves_first_prefills_parameters_offers_limits_and_validates(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    nb = json.loads(notebook('lr = 0.1\nepochs = 3\ntag = "base"', 'print(f"lr={lr} tag={tag}")'))
    nb["cells"][0]["metadata"]["tags"] = ["parameters"]
    (lab_server.root / "tune.ipynb").write_text(json.dumps(nb))
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="tune.ipynb").first.dblclick()
    # An edit the user has not saved: the job must run it, not the file's older content.
    editor = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(1).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+End")
    page.keyboard.insert_text('\nprint("edited before saving")')
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty", has_text="tune").wait_for()
    button = page.locator(".jp-NotebookPanel:visible .jp-gpusched-submit-button")

    button.click()
    dialog = page.locator(".jp-Dialog")
    assert dialog.locator("textarea[name=parameters]").input_value() == (
        "lr=0.1\nepochs=3\ntag=base"
    )
    name = dialog.locator("input[name=name]")
    assert (name.input_value(), name.get_attribute("placeholder")) == ("", "tune.ipynb")
    assert (
        "saved before it is submitted" in dialog.locator(".jp-gpusched-submit-unsaved").inner_text()
    )
    models = dialog.locator("select[name=gpu_model] option").all_inner_texts()
    assert models[0] == "any" and len(models) > 1, models
    # 0 GPUs, or a runtime that is not a duration, says what to fix and cannot be submitted.
    problem = dialog.locator(".jp-gpusched-submit-problem")
    submit = dialog.locator(".jp-mod-accept")
    dialog.locator("input[name=gpus]").fill("0")
    assert problem.inner_text() == "GPUs must be a whole number from 1 to 64"
    assert submit.is_disabled()
    screenshot(page, "lab-submit-dialog-refuses-0-gpus")
    dialog.locator("input[name=gpus]").fill("1")
    dialog.locator("input[name=max_runtime]").fill("soon")
    assert "write it like 90m, 2h or 1h30m" in problem.inner_text()
    assert submit.is_disabled()
    dialog.locator("input[name=max_runtime]").fill("10m")
    assert problem.inner_text() == ""
    assert submit.is_enabled()
    dialog.locator("input[name=name]").fill("tune lr 0.5")
    dialog.locator("select[name=gpu_model]").select_option(index=1)
    model_name = models[1]
    assert "edited before saving" not in (lab_server.root / "tune.ipynb").read_text()
    job_id = fill_submit_dialog(page, gpus=1, mem_gb=None, parameters="lr=0.5\ntag=tuned")

    assert "edited before saving" in (lab_server.root / "tune.ipynb").read_text()
    spec = lab_server.api(f"gpusched/api/jobs/{job_id}")["spec"]
    assert (spec["name"], spec["max_runtime_s"], spec["gpu_models"]) == (
        "tune lr 0.5",
        600,
        [model_name],
    )
    page.wait_for_selector(
        f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="succeeded"]',
        timeout=RUN_TIMEOUT_MS,
    )
    ran = output_notebook(lab_server, job_id).read_text()
    assert "lr=0.5 tag=tuned" in ran and "edited before saving" in ran
    screenshot(page, "lab-submit-dialog-named-run")
