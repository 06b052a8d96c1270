"""A whole notebook on a GPU, in the browser: "Python 3 (1 GPU)" from JupyterLab's launcher.

Real ``jupyter lab`` on the embedded cluster, Debian's chromium; the kernel provisioner runs in
the lab server. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import uuid
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
from _fixtures_polling import scaled, scaled_ms
from _lab_steps import block_every_gpu, cancel_all, kernel_leases, starting_kernel

chromium = _fixtures_lab.chromium
pytestmark = [pytest.mark.browser, pytest.mark.slow]

KERNEL_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """``jupyter lab`` on one policy window (nothing preempted, no share limits)."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("gpu-lab")
    # IPython's first completion loads jedi (seconds on a busy box, a local kernel's too): let
    # the completer wait for it instead of dropping the kernel's answer after 1 s
    completer = base / "settings" / "@jupyterlab" / "completer-extension"
    completer.mkdir(parents=True)
    (completer / "manager.jupyterlab-settings").write_text('{"providerTimeout": 30000}')
    server = start_lab(base, server_config={"GpuSchedPolicy": {"windows": [{"name": "all"}]}})
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def page(chromium: Any, gpu_lab: LabServer) -> Iterator[Any]:
    """JupyterLab on a workspace of its own (no notebook of an earlier test reopened)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    workspace = uuid.uuid4().hex[:8]
    page.goto(f"{gpu_lab.url}lab/workspaces/{workspace}?reset&token={gpu_lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", state="visible")
    show_sidebar(page, "gpusched-panel")
    yield page
    context.close()


def launch(page: Any, display_name: str) -> None:
    """Click the notebook card of a kernel in the launcher; wait until it names the kernel."""
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-addButton").first.click()  # a new launcher
    page.locator(
        f'.jp-LauncherCard[data-category="Notebook"][title="{display_name}"]:visible'
    ).click()
    page.locator(".jp-NotebookPanel").first.wait_for(state="visible")
    page.locator(
        ".jp-NotebookPanel:visible .jp-Toolbar-kernelName", has_text=display_name
    ).wait_for()


def indicator(page: Any) -> Any:
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator")


def wait_idle(page: Any, timeout_ms: int | None = None) -> None:
    """Until the notebook's kernel is idle (not "initializing", "starting" or "busy")."""
    page.wait_for_function(
        "() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
        " const i = p?.querySelector('.jp-Notebook-ExecutionIndicator');"
        " const k = p?.querySelector('.jp-Toolbar-kernelName')?.textContent ?? '';"
        " return i?.dataset.status === 'idle' && k.includes('GPU'); }",
        timeout=timeout_ms or scaled_ms(KERNEL_TIMEOUT_MS / 1000),
    )


def run_cell(page: Any, code: str, expect: str, timeout_ms: int | None = None) -> Any:
    """Type ``code`` into the active cell, run it (Shift+Enter), wait for ``expect`` in it."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell.jp-mod-active")
    index = cell.evaluate("c => [...c.parentNode.children].indexOf(c)")
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    ran = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)
    ran.locator(".jp-OutputArea-output", has_text=expect).wait_for(
        timeout=timeout_ms or scaled_ms(60)
    )
    return ran


def kernel_menu(page: Any, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=item).first.click()


def lease_of_session(server: LabServer) -> dict[str, Any]:
    """The lease of the (one) notebook session's kernel."""
    (session,) = server.api("api/sessions")
    kernel_id = session["kernel"]["id"]
    jobs = server.api("gpusched/api/jobs?kind=lease&limit=1000")["jobs"]
    (lease,) = [j for j in jobs if j["spec"]["labels"].get("gpusched.kernel") == kernel_id]
    return lease


def test_a_notebook_on_a_gpu_kernel_from_the_launcher_to_shut_down(
    page: Any, gpu_lab: LabServer
) -> None:
    launch(page, "Python 3 (1 GPU)")
    wait_idle(page)
    lease = lease_of_session(gpu_lab)
    assert lease["state"] == "running"
    uuids = ",".join(lease["placement"]["gpu_uuids"])
    # the name is made at run time, so only the kernel knows it (not the notebook's text)
    first = run_cell(
        page,
        "import os\nglobals()['gpu_only_' + 'name'] = 41\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'])",
        expect="GPU-",
    )
    assert first.locator(".jp-OutputArea-output").inner_text().strip() == uuids
    run_cell(page, "print(globals()['gpu_only_' + 'name'] + 1)", expect="42")
    screenshot(page, "lab-gpu-kernel-cells")

    # tab completion, answered by the remote kernel (only it knows the name)
    active = page.locator(".jp-NotebookPanel:visible .jp-Cell.jp-mod-active .cm-content")
    active.click()
    page.keyboard.insert_text("gpu_only_na")
    page.keyboard.press("Tab")
    # one match: inserted at once, or offered in the completer when it came late
    offered = page.locator(".jp-Completer-item", has_text="gpu_only_name")
    page.wait_for_function(
        "el => el.textContent === 'gpu_only_name' || document.querySelector('.jp-Completer-item')",
        arg=active.element_handle(),
        timeout=scaled_ms(30),
    )
    if offered.count():
        screenshot(page, "lab-gpu-kernel-completion")
        page.keyboard.press("Enter")
    page.wait_for_function(
        "el => el.textContent === 'gpu_only_name'",
        arg=active.element_handle(),
        timeout=scaled_ms(30),
    )
    screenshot(page, "lab-gpu-kernel-completed")
    page.keyboard.press("Control+a")
    page.keyboard.press("Delete")

    # interrupt a loop from the toolbar
    spin = run_cell(
        page, "import time\nprint('spinning')\nwhile True: time.sleep(0.05)", "spinning"
    )
    page.locator(
        ".jp-NotebookPanel:visible jp-button[data-command='notebook:interrupt-kernel']"
    ).click()
    spin.locator(".jp-OutputArea-output", has_text="KeyboardInterrupt").wait_for()
    wait_idle(page)
    screenshot(page, "lab-gpu-kernel-interrupted")

    # restart: the same lease, a fresh process
    kernel_menu(page, "Restart Kernel…")
    page.locator(".jp-Dialog .jp-mod-accept", has_text="Restart").click()
    page.wait_for_selector(".jp-Dialog", state="detached")
    wait_idle(page)
    run_cell(page, "print('gpu_only_' + 'name' in dir())", expect="False")
    again = lease_of_session(gpu_lab)
    assert (again["id"], again["state"]) == (lease["id"], "running")

    # shut down: the lease is released, its GPU free again
    kernel_menu(page, "Shut Down Kernel")
    page.wait_for_function(
        "() => !document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-Toolbar-kernelName')?.textContent.includes('GPU')",
        timeout=scaled_ms(30),
    )
    ended = gpu_lab.api(f"gpusched/api/jobs/{lease['id']}")
    assert ended["state"] in ("cancelled", "succeeded")
    assert gpu_lab.api("gpusched/api/leases")["leases"] == []
    screenshot(page, "lab-gpu-kernel-shut-down")


def test_a_waiting_gpu_kernel_shows_its_place_in_the_queue_and_can_be_cancelled(
    page: Any, gpu_lab: LabServer
) -> None:
    # every GPU taken by batch jobs that may run 10 minutes
    blockers = block_every_gpu(gpu_lab)
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-gpusched-gpu[data-state=\"batch\"]').length "
            "=== 22",
            timeout=KERNEL_TIMEOUT_MS,
        )
        launch(page, "Python 3 (1 GPU)")
        toast = page.locator(".Toastify__toast", has_text="GPU kernel for Untitled")
        toast.locator("text=#1 in the queue").wait_for(timeout=scaled_ms(30))
        page.locator(".Toastify__toast", has_text="expected to start in").wait_for()
        text = toast.inner_text()
        assert "is waiting (lease #" in text and "waiting: needs 1 GPU" in text
        screenshot(page, "lab-gpu-kernel-waiting")
        toast.locator("button", has_text="Cancel").click()
        # neutral: a note, no "Error Starting Kernel" dialog, no 500 in the server's log
        note = page.locator(".Toastify__toast", has_text="GPU kernel not started: lease")
        note.wait_for(timeout=scaled_ms(30))
        assert re.match(
            r"GPU kernel not started: lease \d+ cancelled by \S+\. The notebook has no kernel "
            r"now; pick one to run its cells\.",
            note.inner_text(),
        )
        toast.wait_for(state="detached")
        page.locator(".jp-StatusBar-Widget", has_text="No Kernel").first.wait_for()
        page.wait_for_timeout(1000)  # room for a dialog that must not come
        screenshot(page, "lab-gpu-kernel-cancelled")
        assert page.locator(".jp-Dialog").count() == 0
        assert " 500 " not in gpu_lab.log_path.read_text()
    finally:
        cancel_all(gpu_lab, blockers)


#: The idle timeout of the lab below: long enough for a cell and a look, short for a test.
IDLE_S = round(scaled(15.0))


@pytest.fixture(scope="module")
def idle_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """``jupyter lab`` whose leases idle for IDLE_S are reclaimed, with a saved GPU notebook."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("idle-lab")
    window = {"name": "all", "lease_idle_timeout_s": IDLE_S}
    server = start_lab(
        base,
        server_config={
            "GpuSchedPolicy": {"windows": [window]},
            "GpuLeaseProvisioner": {"watch_interval_s": 0.5, "touch_interval_s": 1.0},
        },
    )
    nb = json.loads(notebook("import os\nprint('ran on', os.environ['CUDA_VISIBLE_DEVICES'])"))
    nb["metadata"]["kernelspec"] = {"name": "gpusched-1gpu", "display_name": "Python 3 (1 GPU)"}
    (server.root / "train.ipynb").write_text(json.dumps(nb))
    yield server
    assert stop_lab_once(server), "jupyter lab did not stop on one SIGTERM"
    shutil.rmtree(base, ignore_errors=True)


def stop_lab_once(server: LabServer) -> bool:
    """SIGTERM once; whether jupyter lab stopped by itself (else it is killed)."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=scaled(30))
        return True
    except subprocess.TimeoutExpired:
        stop_lab(server)
        return False


def test_a_gpu_kernel_s_life_queued_cell_reload_ready_reclaimed_and_asked_again(
    chromium: Any, idle_lab: LabServer
) -> None:
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    workspace = uuid.uuid4().hex[:8]
    url = f"{idle_lab.url}lab/workspaces/{workspace}/tree/train.ipynb?token={idle_lab.token}"
    blockers = block_every_gpu(idle_lab)
    try:
        page.goto(url + "&reset")
        waiting = page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb is waiting")
        waiting.wait_for(timeout=scaled_ms(60))
        # a cell run while the kernel waits is kept, not dropped ("[ ]:" forever before)
        starting_kernel(page)
        cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").first
        cell.locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        cell.locator(".jp-InputPrompt", has_text="[*]").wait_for()
        assert "jp-gpusched-queuedCell" in (cell.get_attribute("class") or "")
        screenshot(page, "lab-gpu-kernel-cell-queued")
        (lease,) = kernel_leases(idle_lab, "train.ipynb")
        # a reload re-attaches to the waiting lease: no second request for a GPU
        page.reload()
        waiting.wait_for(timeout=scaled_ms(60))
        assert "(lease #{})".format(lease["id"]) in waiting.inner_text()
        assert [j["id"] for j in kernel_leases(idle_lab, "train.ipynb")] == [lease["id"]]
        starting_kernel(page)
        cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").first
        cell.locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        cell.locator(".jp-InputPrompt", has_text="[*]").wait_for()
        cancel_all(idle_lab, blockers)
        blockers = []
        # the kernel starts: "ready on NODE GPU i", and the kept cell runs
        ready = page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb is ready on")
        ready.wait_for(timeout=scaled_ms(90))
        cell.locator(".jp-OutputArea-output", has_text="ran on GPU-").wait_for(
            timeout=scaled_ms(90)
        )
        ran = idle_lab.api(f"gpusched/api/jobs/{lease['id']}")
        node, gpu = ran["placement"]["node"], ran["placement"]["gpu_indices"][0]
        assert f"is ready on {node} GPU {gpu} (lease #{lease['id']})" in ready.inner_text()
        assert ran["spec"]["lease_name"].endswith("train.ipynb:kernel")
        screenshot(page, "lab-gpu-kernel-queued-cell-ran")
        # left idle, its GPU is taken back: the notebook is told why, and that state is lost
        lost = page.locator(".Toastify__toast", has_text="GPU kernel for train.ipynb lost its GPU")
        lost.wait_for(timeout=scaled_ms(IDLE_S + 60))
        text = lost.inner_text()
        assert "reclaimed" in text and "variables and imports are gone" in text
        page.locator(
            ".jp-NotebookPanel:visible .jp-Toolbar-kernelName", has_text="No Kernel"
        ).wait_for()
        ask = lost.locator("button", has_text="Ask again")
        ask.wait_for()
        page.wait_for_timeout(500)  # the toast slides in
        screenshot(page, "lab-gpu-kernel-reclaimed")
        ask.click()
        try:
            wait_idle(page)
        finally:
            screenshot(page, "lab-gpu-kernel-asked-again")
        again = [j for j in kernel_leases(idle_lab, "train.ipynb") if j["id"] != lease["id"]]
        assert [j["state"] for j in again] == ["running"]
        assert " 500 " not in idle_lab.log_path.read_text()
    finally:
        cancel_all(idle_lab, blockers)
        context.close()
