"""A newcomer's first hour, walked in one browser session as the README's first pages tell it.

Real ``jupyter lab`` on the embedded cluster, Debian's chromium, in the order a new user meets
things: find the GPU panel, run a ``%%gpu`` cell, misspell an option in the magic and in the
CLI, open a notebook on a GPU kernel while every GPU is taken and run a cell that waits for it,
see that kernel's GPU taken back when left idle, submit a script that fails and read why, and
watch the dashboard follow the cluster for two minutes. Screenshots: ``test-artifacts/walk-*``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import (
    BIN,
    CHROMIUM,
    LabServer,
    notebook,
    screenshot,
    show_sidebar,
    start_lab,
    stop_lab,
)
from _fixtures_polling import scaled, scaled_ms
from _lab_steps import announced_job, block_every_gpu, cancel_all, starting_kernel

chromium = _fixtures_lab.chromium
pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: Leases idle this long are taken back: time for a cell and a look, short for a walk.
IDLE_S = round(scaled(15.0))
#: How long the dashboard is watched while the walk goes on.
DASHBOARD_S = 120
WAIT_MS = scaled_ms(90)
PANEL = "#gpusched-panel"
LATEST = "document.querySelector('#gpusched-dashboard .jp-gpusched-history')?.dataset.latest"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The default simulated lab, idle leases reclaimed after IDLE_S, nodes probed each second."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("walk")
    server = start_lab(
        base,
        "--GpuSchedApp.inventory_interval_s=1",
        server_config={
            "GpuSchedPolicy": {"windows": [{"name": "all", "lease_idle_timeout_s": IDLE_S}]},
            "GpuLeaseProvisioner": {"watch_interval_s": 0.5, "touch_interval_s": 1.0},
        },
    )
    root = server.root
    (root / "first.ipynb").write_text(
        notebook(
            "%load_ext jupyter_gpusched",
            "%%gpu --gpus 1\nimport os\nprint('cell on', os.environ['CUDA_VISIBLE_DEVICES'])",
            "%gpu release",
            "%%gpu --gpu 2\nprint('never')",
        )
    )
    kernel_cell = "import os\nprint('kernel on', os.environ['CUDA_VISIBLE_DEVICES'])"
    train = json.loads(notebook(kernel_cell))
    train["metadata"]["kernelspec"] = {"name": "gpusched-1gpu", "display_name": "Python 3 (1 GPU)"}
    (root / "train.ipynb").write_text(json.dumps(train))
    (root / "prepare.py").write_text("print('reading the data')\nopen('data/train.csv')\n")
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def page(chromium: Any, lab: LabServer) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    page.goto(f"{lab.url}lab/workspaces/walk?reset&token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", state="visible")
    yield page
    context.close()


def open_file(page: Any, name: str) -> None:
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text=name).wait_for()


def test_a_newcomers_first_hour(page: Any, lab: LabServer) -> None:
    # 1. The GPU panel: the sidebar icon named "GPU scheduler", what is free first.
    icon = page.locator('.jp-SideBar [data-id="gpusched-panel"]')
    assert icon.get_attribute("title") == "GPU scheduler"
    show_sidebar(page, "gpusched-panel")
    page.locator(f"{PANEL} .jp-gpusched-figures", has_text="22/22 GPUs free").wait_for()
    screenshot(page, "walk-1-panel")

    # The dashboard opens beside the work and is looked at again at the end.
    page.locator(f"{PANEL} .jp-gpusched-open-dashboard").click()
    page.wait_for_function(f"() => Boolean({LATEST})", timeout=WAIT_MS)
    watched_from = datetime.fromisoformat(page.evaluate(f"() => {LATEST}"))

    # 2. A %%gpu cell runs on a GPU; 3. a misspelt option is named, with what was meant
    # (the error ends Run All, so it comes last).
    open_file(page, "first.ipynb")
    page.locator(".jp-StatusBar-Widget", has_text="Python 3 (ipykernel) | Idle").wait_for(
        timeout=WAIT_MS
    )
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    cells = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell")
    expected = {
        1: "cell on GPU-",
        2: "%gpu: released lease",
        3: "UsageError: unknown option --gpu; did you mean --gpus? (see %gpu --help)",
    }
    for i, text in expected.items():
        cells.nth(i).locator(".jp-OutputArea-output", has_text=text).first.wait_for(timeout=WAIT_MS)
    screenshot(page, "walk-2-gpu-cell-and-typo")
    cli = subprocess.run(
        [BIN / "jupyter-gpusched", "submit", "--gpu", "2", "--url", lab.url, "--token", lab.token]
        + ["--", "python", "prepare.py"],
        cwd=lab.root,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert cli.returncode == 2, cli
    assert "unknown option --gpu; did you mean --gpus?" in cli.stderr

    # 4. A GPU kernel while every GPU is taken: a cell run meanwhile waits and then runs.
    blockers = block_every_gpu(lab)
    try:
        open_file(page, "train.ipynb")
        waiting = page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb is waiting")
        waiting.wait_for(timeout=WAIT_MS)
        starting_kernel(page)
        cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").first
        cell.locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        cell.locator(".jp-InputPrompt", has_text="[*]").wait_for()
        screenshot(page, "walk-4-cell-waits-for-its-gpu")
    finally:
        cancel_all(lab, blockers)
    page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb is ready on").wait_for(
        timeout=WAIT_MS
    )
    cell.locator(".jp-OutputArea-output", has_text="kernel on GPU-").wait_for(timeout=WAIT_MS)
    screenshot(page, "walk-4-cell-ran")

    # 5. Left idle, the kernel's GPU is taken back: the notebook says so and why.
    lost = page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb lost its GPU")
    lost.wait_for(timeout=scaled_ms(IDLE_S + 60))
    assert "reclaimed" in lost.inner_text()
    assert "variables and imports are gone" in lost.inner_text()
    lost.locator("button", has_text="Ask again").wait_for()
    screenshot(page, "walk-5-gpu-taken-back")

    # 6. A script that fails: submitted from the file browser, its reason is its error line.
    show_sidebar(page, "filebrowser")
    page.locator(".jp-DirListing-item", has_text="prepare.py").first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Submit Script to GPU Queue").click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    job_id = announced_job(page)
    show_sidebar(page, "gpusched-panel")
    row = page.locator(f'{PANEL} .jp-gpusched-job-row[data-job-id="{job_id}"]')
    page.wait_for_selector(
        f'{PANEL} .jp-gpusched-job-row[data-job-id="{job_id}"][data-state="failed"]',
        timeout=WAIT_MS,
    )
    reason = row.get_attribute("title") or ""
    assert "FileNotFoundError" in reason and "data/train.csv" in reason, reason
    screenshot(page, "walk-6-failed-script")

    # 7. The dashboard has followed the cluster the whole time (two minutes at least).
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="GPU cluster").click()
    page.wait_for_function(
        f"until => {LATEST} && Date.parse({LATEST}) >= until",
        arg=(watched_from.timestamp() + DASHBOARD_S) * 1000,
        timeout=scaled_ms(DASHBOARD_S + 60),
    )
    screenshot(page, "walk-7-dashboard")
