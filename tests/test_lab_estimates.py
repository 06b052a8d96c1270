"""The panel's queue rows say what an expected start rests on (issue #32).

"starts in 3h59m" rested on a 4 h guess for jobs with no runtime limit but read as certain.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import LabServer, screenshot, start_lab, stop_lab

chromium = _fixtures_lab.chromium
lab_page = _fixtures_lab.lab_page


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The lab with one window all week, no batch time limit: runtimes stay undeclared."""
    if not _fixtures_lab.CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {_fixtures_lab.CHROMIUM}")
    base = tmp_path_factory.mktemp("lab-estimates")
    server = start_lab(base, server_config={"GpuSchedPolicy": {"windows": [{"name": "all"}]}})
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_TIMEOUT_MS = 90_000


def call(page: Any, server: LabServer, method: str, path: str, body: Any = None) -> Any:
    """One API call from the page, as the panel makes them (the page's login and token)."""
    return page.evaluate(
        """async ([url, token, method, body]) => {
            const r = await fetch(url, {
                method,
                headers: {Authorization: `token ${token}`, 'Content-Type': 'application/json'},
                body: body === null ? undefined : JSON.stringify(body)
            });
            if (!r.ok) { throw new Error(`${method} ${url}: ${r.status} ${await r.text()}`); }
            return await r.json();
        }""",
        [server.url + path, server.token, method, body],
    )


def test_a_start_behind_jobs_with_no_runtime_limit_reads_as_a_guess_with_the_nudge(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    page.wait_for_selector(".jp-gpusched-live.jp-mod-live")
    # Both 8-GPU nodes taken by jobs that declare no runtime and have no history: a guess.
    hold = {"kind": "script", "command": ["sleep", "600"], "gpus": 8}
    jobs = [call(page, lab_server, "POST", "gpusched/api/jobs", hold)["id"] for _ in range(2)]
    try:
        for job_id in jobs:
            page.wait_for_selector(
                f'.jp-gpusched-job-row[data-job-id="{job_id}"][data-state="running"]',
                timeout=RUN_TIMEOUT_MS,
            )
        eight = {"kind": "script", "command": ["true"], "gpus": 8, "max_runtime_s": 600}
        waiting = call(page, lab_server, "POST", "gpusched/api/jobs", eight)["id"]
        jobs.append(waiting)
        eta = page.locator(
            f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{waiting}"] .jp-gpusched-eta'
        )
        page.wait_for_function(
            "id => document.querySelector(`.jp-gpusched-job-row[data-job-id='${id}'] "
            ".jp-gpusched-eta`)?.textContent.endsWith('by a guess')",
            arg=waiting,
            timeout=RUN_TIMEOUT_MS,
        )
        assert re.fullmatch(r"starts in (3h59m|4h) \(\d\d:\d\d\) by a guess", eta.inner_text())
        note = eta.get_attribute("title") or ""
        # the node it is expected on frees when that node's holder ends: a guess, named
        holder = re.match(r"a guess: job (\d+) set no --max-runtime and has no past", note)
        assert holder and int(holder.group(1)) in jobs[:2], note
        assert "set --max-runtime for a firm estimate" in note, note
        row = page.locator(f'#gpusched-panel .jp-gpusched-job-row[data-job-id="{waiting}"]')
        assert row.locator(".jp-gpusched-eta-note").inner_text() == note  # shown, not hovered
        screenshot(page, "lab-panel-estimate-guess")
    finally:
        for job_id in jobs:  # those still queued or running
            if lab_server.api(f"gpusched/api/jobs/{job_id}")["state"] in ("queued", "running"):
                call(page, lab_server, "DELETE", f"gpusched/api/jobs/{job_id}")
