"""The lab panel in a newcomer's first hour: real ``jupyter lab``, embedded cluster, chromium.

What is free and my jobs come first, the policy below; the sidebar icon is named; a job's page
cancels it; a Python script is submitted from the file browser or the panel; the submit dialog
checks against the cluster as one types and keeps what was typed when the server refuses; the
dashboard follows the cluster while open and opens again after its tab was closed. Every test
saves a screenshot to ``test-artifacts/``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import (
    CHROMIUM,
    LabServer,
    notebook,
    screenshot,
    show_sidebar,
    start_lab,
    stop_lab,
)
from _fixtures_polling import scaled_ms
from _lab_steps import announced_job, page_call

chromium = _fixtures_lab.chromium
lab_page = _fixtures_lab.lab_page
pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_TIMEOUT_MS = scaled_ms(90)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The default simulated lab, probed every second (the charts get a sample a second)."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("lab-first-hour")
    server = start_lab(base, "--GpuSchedApp.inventory_interval_s=1")
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


def in_order(page: Any, *selectors: str) -> bool:
    """Whether the elements matching ``selectors`` (first of each) follow in document order."""
    return bool(
        page.evaluate(
            """sels => sels.map(s => document.querySelector(s)).every((el, i, all) =>
                el && (i === 0 || (all[i - 1].compareDocumentPosition(el)
                                   & Node.DOCUMENT_POSITION_FOLLOWING)))""",
            list(selectors),
        )
    )


def test_panel_leads_with_what_is_free_and_my_jobs_and_its_icon_is_named(lab_page: Any) -> None:
    page = lab_page
    tab = page.locator('.jp-SideBar [data-id="gpusched-panel"]')
    assert tab.get_attribute("title") == "GPU scheduler"
    panel = "#gpusched-panel"
    page.wait_for_selector(f"{panel} .jp-gpusched-rules li")
    assert re.fullmatch(
        r"22/22 GPUs free · 0 waiting, 0 running",
        page.locator(f"{panel} .jp-gpusched-figures").inner_text().strip(),
    )
    assert in_order(
        page,
        f"{panel} .jp-gpusched-figures",
        f"{panel} .jp-gpusched-fragmentation",
        f"{panel} .jp-gpusched-map",
        f"{panel} .jp-gpusched-queue",
        f"{panel} .jp-gpusched-leases",
        f"{panel} .jp-gpusched-window",
        f"{panel} .jp-gpusched-rules",
    )
    assert page.locator(f"{panel} .jp-gpusched-queue h3").inner_text().lower() == "my jobs"
    assert page.locator(f"{panel} .jp-gpusched-policy h3").inner_text().lower() == "policy now"
    tab.hover()
    screenshot(page, "lab-first-hour-panel-order")


def test_a_running_job_is_cancelled_from_its_page(lab_page: Any, lab_server: LabServer) -> None:
    page = lab_page
    page.wait_for_selector(".jp-gpusched-live.jp-mod-live")
    hold = {"kind": "script", "command": ["sleep", "600"], "gpus": 1, "name": "to-cancel"}
    job_id = page_call(page, lab_server, "POST", "gpusched/api/jobs", hold)["id"]
    row = page.locator(f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{job_id}"]')
    page.wait_for_selector(
        f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{job_id}"][data-state="running"]',
        timeout=RUN_TIMEOUT_MS,
    )
    row.locator("a.jp-gpusched-job").click()
    job_page = page.locator(f"#gpusched-job-{job_id}")
    button = job_page.locator(".jp-gpusched-page-cancel")
    button.wait_for(state="visible")
    assert button.inner_text() == "Cancel job"
    screenshot(page, "lab-job-page-cancel-button")
    button.click()
    page.locator(".jp-Dialog .jp-mod-accept", has_text="Cancel job").click()
    job_page.locator(".jp-gpusched-state.jp-mod-cancelled").wait_for(timeout=RUN_TIMEOUT_MS)
    assert job_page.locator(".jp-gpusched-page-cancel").count() == 0
    assert lab_server.api(f"gpusched/api/jobs/{job_id}")["state"] == "cancelled"
    screenshot(page, "lab-job-page-cancelled")


def test_a_python_script_is_submitted_from_the_file_browser_with_arguments_and_environment(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    (lab_server.root / "train.py").write_text(
        "import os, sys\nprint('argv', sys.argv[1:], 'STEPS', os.environ.get('STEPS'))\n"
    )
    # The panel offers it too: the dialog asks which script.
    page.locator("#gpusched-panel .jp-gpusched-submit-script").click()
    dialog = page.locator(".jp-Dialog")
    assert dialog.locator(".jp-Dialog-header").inner_text() == "Submit a script to the GPU queue"
    dialog.locator("input[name=script]").fill("nowhere.txt")
    problem = dialog.locator(".jp-gpusched-submit-problem")
    assert problem.inner_text() == "nowhere.txt is not a Python script (.py)"
    assert dialog.locator(".jp-mod-accept").is_disabled()
    dialog.locator(".jp-mod-reject").click()
    dialog.wait_for(state="detached")

    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="train.py").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Submit Script to GPU Queue").click()
    assert dialog.locator("input[name=script]").input_value() == "train.py"
    dialog.locator("input[name=args]").fill("--steps 3 'two words'")
    dialog.locator("textarea[name=env]").fill("STEPS=20")
    dialog.locator("input[name=gpus]").fill("2")
    assert problem.inner_text() == ""
    screenshot(page, "lab-submit-script-dialog")
    dialog.locator(".jp-mod-accept").click()
    job_id = announced_job(page)

    spec = lab_server.api(f"gpusched/api/jobs/{job_id}")["spec"]
    assert (spec["command"], spec["env"], spec["gpus"], spec["name"]) == (
        ["python3", "train.py", "--steps", "3", "two words"],
        {"STEPS": "20"},
        2,
        "train.py",
    )
    show_sidebar(page, "gpusched-panel")
    row = f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{job_id}"]'
    page.wait_for_selector(
        f'{row}[data-state="succeeded"], {row}[data-state="failed"]', timeout=RUN_TIMEOUT_MS
    )
    job = lab_server.api(f"gpusched/api/jobs/{job_id}")
    assert job["state"] == "succeeded", (job, lab_server.log_tail())
    page.locator(
        f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{job_id}"] .jp-gpusched-log-button'
    ).click()
    page.wait_for_function(
        "id => document.querySelector(`#gpusched-log-${id} .jp-gpusched-log-text`)"
        "?.textContent.includes(\"argv ['--steps', '3', 'two words'] STEPS 20\")",
        arg=job_id,
    )
    screenshot(page, "lab-submit-script-ran")


def test_submit_dialog_checks_the_cluster_as_one_types_and_keeps_input_when_refused(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    nb = lab_server.root / "keep.ipynb"
    nb.write_text(notebook('print("kept")'))
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="keep.ipynb").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Submit to GPU Queue").click()
    dialog = page.locator(".jp-Dialog")
    problem = dialog.locator(".jp-gpusched-submit-problem")
    submit = dialog.locator(".jp-mod-accept")

    # The largest nodes of the simulated lab have 8 GPUs of 80 GB.
    dialog.locator("input[name=gpus]").fill("9")
    assert problem.inner_text() == (
        "no node has 9 GPUs; the largest has 8 (a100-0): ask for at most 8, or split the "
        "work into several jobs"
    )
    assert submit.is_disabled()
    screenshot(page, "lab-submit-dialog-no-node-has-9-gpus")
    dialog.locator("input[name=gpus]").fill("2")
    dialog.locator("input[name=gpu_mem_gb]").fill("100")
    assert problem.inner_text().startswith("no GPU has 100 GB of memory; the largest have 80 GB")
    assert submit.is_disabled()
    dialog.locator("input[name=gpu_mem_gb]").fill("")
    dialog.locator("input[name=name]").fill("kept name")
    dialog.locator("input[name=max_runtime]").fill("5m")
    dialog.locator("textarea[name=parameters]").fill("lr=0.5")
    assert problem.inner_text() == "" and submit.is_enabled()

    # The file goes away before Submit: the server refuses, and nothing typed is lost.
    nb.unlink()
    submit.click()
    refused = page.locator(".jp-Dialog .jp-gpusched-submit-refused")
    refused.wait_for(state="visible")
    assert "keep.ipynb" in refused.inner_text() and "not found" in refused.inner_text()
    assert [
        dialog.locator(f"[name={name}]").input_value()
        for name in ("name", "gpus", "max_runtime", "parameters")
    ] == ["kept name", "2", "5m", "lr=0.5"]
    screenshot(page, "lab-submit-dialog-kept-after-refusal")

    nb.write_text(notebook('print("kept")'))
    dialog.locator(".jp-mod-accept").click()
    job_id = announced_job(page)
    assert dialog.count() == 0
    spec = lab_server.api(f"gpusched/api/jobs/{job_id}")["spec"]
    assert (spec["name"], spec["gpus"], spec["max_runtime_s"], spec["parameters"]) == (
        "kept name",
        2,
        300,
        {"lr": 0.5},
    )


def test_dashboard_follows_the_cluster_while_open_and_reopens_after_close(lab_page: Any) -> None:
    page = lab_page
    dash = page.locator("#gpusched-dashboard")
    latest = "document.querySelector('#gpusched-dashboard .jp-gpusched-history')?.dataset.latest"
    for opening in ("first", "again"):
        page.locator("#gpusched-panel .jp-gpusched-open-dashboard").click()
        dash.wait_for(state="visible")
        page.wait_for_function(f"() => Boolean({latest})")
        first = page.evaluate(f"() => {latest}")
        # Later samples are drawn while it stays open (the nodes are probed every second).
        page.wait_for_function(f"first => {latest} > first", arg=first, timeout=RUN_TIMEOUT_MS)
        assert dash.locator(".jp-gpusched-history-node").count() == len(_fixtures_lab.SIM_NODES)
        screenshot(page, f"lab-dashboard-live-{opening}")
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="GPU cluster")
        tab.locator(".lm-TabBar-tabCloseIcon").click()
        dash.wait_for(state="detached")
