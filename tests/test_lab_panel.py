"""The JupyterLab panel, end to end: real ``jupyter lab``, embedded cluster, headless chromium.

Every test saves a screenshot to ``test-artifacts/``.
"""

from __future__ import annotations

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
    """The executed notebook the server named in the finished job's labels."""
    labels = server.api(f"gpusched/api/jobs/{job_id}")["spec"]["labels"]
    assert "output_notebook" in labels, labels
    return server.root / labels["output_notebook"]


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
    assert row.locator(".jp-gpusched-size").inner_text() == "2 GPUs × 8 GB"
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
    assert re.fullmatch(r"next (\w{3} )?22:00", row.locator(".jp-gpusched-next").inner_text())
    assert row.locator(".jp-gpusched-size").inner_text() == "2 GPUs × 16 GB"
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
