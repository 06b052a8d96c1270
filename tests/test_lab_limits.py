"""Per-user limits as the lab panel shows them: one clear line, in a real browser.

``jupyter lab`` with the limits on (as the lab-wide service has them) and small: one queued
job, one stream. A notebook submitted past the queued limit is refused with the limit and the
user's count in one line; a second lab tab, past the streams limit, says its live updates are
refused and why, while the first tab's go on.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import (
    LabServer,
    notebook,
    open_lab,
    screenshot,
    show_sidebar,
    start_lab,
    stop_lab,
)
from _fixtures_server import FAR_FUTURE

chromium = _fixtures_lab.chromium
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LIMITS = {"limit_defaults": "on", "limits": {"queued_jobs": 1, "streams": 1}}


@pytest.fixture(scope="module")
def limited_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """``jupyter lab`` whose user may queue one job and hold one stream."""
    if not _fixtures_lab.CHROMIUM.exists():
        pytest.skip(f"Debian's chromium is missing at {_fixtures_lab.CHROMIUM}")
    base = tmp_path_factory.mktemp("lab-limits")
    server = start_lab(
        base, server_config={"GpuSchedPolicy": {"windows": [{"name": "all"}], **LIMITS}}
    )
    yield server
    stop_lab(server)
    shutil.rmtree(base, ignore_errors=True)


def post(server: LabServer, path: str, body: Any) -> Any:
    req = urllib.request.Request(
        f"{server.url}gpusched/api/{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_a_submit_past_the_queued_limit_says_the_limit_and_the_count_in_one_line(
    chromium: Any, limited_lab: LabServer
) -> None:
    waiting = post(limited_lab, "jobs", {"kind": "script", "command": ["true"],
                                         "not_before": FAR_FUTURE})  # fmt: skip
    (limited_lab.root / "one-too-many.ipynb").write_text(notebook('print("never")'))
    page = open_lab(chromium, limited_lab)
    try:
        show_sidebar(page, "filebrowser")
        item = page.locator(".jp-DirListing-item", has_text="one-too-many.ipynb").first
        item.click(button="right")
        page.locator(".lm-Menu-item", has_text="Submit to GPU Queue").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        # The dialog stays, with the server's reason above what was typed.
        refusal = page.locator(".jp-Dialog .jp-gpusched-submit-refused")
        refusal.wait_for(state="visible")
        text = refusal.inner_text().strip()
        screenshot(page, "lab-limits-queued-refused")
        assert "\n" not in text, text
        assert text.startswith("The server refused it: "), text
        assert "has 1 queued job," in text and "(GpuSchedPolicy.limits queued_jobs) is 1" in text
    finally:
        page.context.close()
    assert waiting["state"] == "queued"


def test_a_tab_past_the_streams_limit_says_its_live_updates_are_refused(
    chromium: Any, limited_lab: LabServer
) -> None:
    first = open_lab(chromium, limited_lab)
    try:
        # the first tab holds the one stream: its panel lists the queue live, without a refusal
        first.locator("#gpusched-panel .jp-gpusched-queue").wait_for(state="visible")
        second = open_lab(chromium, limited_lab)
        try:
            refused = second.locator("#gpusched-panel .jp-gpusched-refused")
            refused.wait_for(state="visible")
            text = refused.inner_text().strip()
            screenshot(second, "lab-limits-streams-refused")
            assert "\n" not in text, text
            assert text.startswith("Live updates refused: ") and "1 stream open" in text
            assert "(GpuSchedPolicy.limits streams) is 1" in text
            assert first.locator("#gpusched-panel .jp-gpusched-refused").count() == 0
        finally:
            second.context.close()
    finally:
        first.context.close()
