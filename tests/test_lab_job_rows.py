"""The panel's job rows follow every job to its end: real ``jupyter lab``, chromium.

Jobs cancelled together (a test's clean-up, a user's "cancel all") each reach "cancelled" in
"My jobs"; none stays "running" while the map says its GPUs are free.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import (
    CHROMIUM,
    LabServer,
    screenshot,
    show_sidebar,
    start_lab,
    stop_lab,
)
from _fixtures_polling import scaled_ms
from _lab_steps import api_call, block_every_gpu

chromium = _fixtures_lab.chromium
pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL = "#gpusched-panel"
WAIT_MS = scaled_ms(90)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The default simulated lab (8, 8, 4 and 2 GPUs), one window reserving none of them."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {CHROMIUM}; run `make system-deps`")
    base = tmp_path_factory.mktemp("lab-job-rows")
    server = start_lab(base, server_config={"GpuSchedPolicy": {"windows": [{"name": "all"}]}})
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


def row(job_id: int, state: str) -> str:
    return f'{PANEL} .jp-gpusched-job-row[data-job-id="{job_id}"][data-state="{state}"]'


@pytest.fixture
def page_and_events(chromium: Any, lab_server: LabServer) -> Iterator[tuple[Any, list[Any]]]:
    """The lab with the GPU panel open, and every events message the page received."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    frames: list[dict[str, Any]] = []
    page.on(
        "websocket",
        lambda ws: ws.on(
            "framereceived",
            lambda f: frames.append(json.loads(f)) if "gpusched" in ws.url else None,
        ),
    )
    page.goto(f"{lab_server.url}lab?token={lab_server.token}")
    page.wait_for_selector("#jp-main-dock-panel", state="visible")
    show_sidebar(page, "gpusched-panel")
    yield page, frames
    context.close()


def test_jobs_cancelled_together_each_show_cancelled(
    page_and_events: tuple[Any, list[Any]], lab_server: LabServer
) -> None:
    page, frames = page_and_events
    page.locator(f"{PANEL} .jp-gpusched-figures", has_text="22/22 GPUs free").wait_for()
    for round_ in range(2):
        jobs = block_every_gpu(lab_server)
        for job in jobs:
            page.wait_for_selector(row(job["id"], "running"), timeout=WAIT_MS)
        # A GPU kernel waits meanwhile (the panel follows it closely); the cancels start it.
        kernel = {"gpusched.kernel": f"k{round_}", "gpusched.notebook": f"k{round_}.ipynb"}
        lease = api_call(lab_server, "POST", "jobs", {"kind": "lease", "gpus": 1, "labels": kernel})
        for job in jobs:  # in a row from another process, as a clean-up does
            api_call(lab_server, "DELETE", f"jobs/{job['id']}")
        page.wait_for_selector(
            f'{PANEL} [data-job-id="{lease["id"]}"][data-state="running"]', timeout=WAIT_MS
        )
        api_call(lab_server, "DELETE", f"jobs/{lease['id']}")
        page.locator(f"{PANEL} .jp-gpusched-figures", has_text="22/22 GPUs free").wait_for(
            timeout=WAIT_MS
        )
        try:
            for job in jobs:
                page.wait_for_selector(row(job["id"], "cancelled"), timeout=scaled_ms(10))
        except Exception:
            seen = [
                (
                    f.get("id"),
                    f.get("kind"),
                    f.get("job_id"),
                    f.get("to_state"),
                    (f.get("job") or {}).get("state"),
                )
                for f in frames
                if f.get("kind") != "cluster"
            ]
            screenshot(page, "lab-job-rows-stale")
            raise AssertionError(f"stale row; events seen: {seen}") from None
    screenshot(page, "lab-job-rows-all-cancelled")


def test_a_job_whose_end_the_stream_lost_still_shows_cancelled(
    chromium: Any, lab_server: LabServer
) -> None:
    """The events websocket loses one job's end (as a dropped or reordered update would):
    the row must still reach "cancelled" once the map shows the job's GPUs free."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(scaled_ms(30))
    lost: list[int] = []  # the job whose end is dropped (set once it is known)
    dropped: list[dict[str, Any]] = []

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            event = json.loads(message)
            if lost and event.get("job_id") == lost[0] and event.get("kind") == "state":
                dropped.append(event)
                return
            ws.send(message)

        server.on_message(from_server)

    page.route_web_socket("**/gpusched/api/events**", relay)
    try:
        page.goto(f"{lab_server.url}lab?token={lab_server.token}")
        page.wait_for_selector("#jp-main-dock-panel", state="visible")
        show_sidebar(page, "gpusched-panel")
        page.locator(f"{PANEL} .jp-gpusched-figures", has_text="22/22 GPUs free").wait_for()
        jobs = block_every_gpu(lab_server)
        for job in jobs:
            page.wait_for_selector(row(job["id"], "running"), timeout=WAIT_MS)
        lost.append(jobs[1]["id"])
        for job in jobs:
            api_call(lab_server, "DELETE", f"jobs/{job['id']}")
        page.locator(f"{PANEL} .jp-gpusched-figures", has_text="22/22 GPUs free").wait_for(
            timeout=WAIT_MS
        )
        for job in jobs:
            page.wait_for_selector(row(job["id"], "cancelled"), timeout=scaled_ms(30))
        assert [e["to_state"] for e in dropped] == ["cancelled"], dropped
        screenshot(page, "lab-job-rows-lost-end-recovered")
    finally:
        context.close()
