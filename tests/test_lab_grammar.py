"""The option grammar in the browser: a notebook in JupyterLab submits with --env and is told
which option a typo meant, as a newcomer meets it in the first hour.

Real ``jupyter lab`` on the embedded cluster, Debian's chromium, a local Python kernel running
the ``%gpu`` magic. The screenshot goes to ``test-artifacts/grammar-misspelt-option.png``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import _fixtures_lab
import pytest
from _fixtures_lab import LabServer, notebook, screenshot
from _fixtures_polling import scaled_ms

chromium = _fixtures_lab.chromium
lab_server = _fixtures_lab.lab_server
lab_page = _fixtures_lab.lab_page
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LATER = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0).isoformat()


def test_a_notebook_sets_the_env_of_its_job_and_is_told_which_option_a_typo_meant(
    lab_page: Any, lab_server: LabServer
) -> None:
    page = lab_page
    (lab_server.root / "train.py").write_text("import os\nprint(os.environ['STEPS'])\n")
    (lab_server.root / "first-hour.ipynb").write_text(
        notebook(
            "%load_ext jupyter_gpusched",
            f"%gpu submit train.py --env STEPS=20 --at {LATER}",
            "%gpu submit --help",
            "%%gpu --gpu 2\nprint('never')",
        )
    )
    page.goto(f"{lab_server.url}lab/tree/first-hour.ipynb?token={lab_server.token}")
    panel = page.locator(".jp-NotebookPanel:visible")
    panel.wait_for(state="visible")
    # the kernel is up when the status bar says so (the indicator reads idle before that)
    page.locator(".jp-StatusBar-Widget", has_text="Python 3 (ipykernel) | Idle").wait_for(
        timeout=scaled_ms(90)
    )
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    cells = panel.locator(".jp-Notebook .jp-Cell")
    expected = {
        1: "%gpu: submitted job ",
        2: "usage: %gpu submit [OPTIONS] SCRIPT [ARGS ...] [-- ARGS ...]",
        3: "UsageError: unknown option --gpu; did you mean --gpus? (see %gpu --help)",
    }
    for i, text in expected.items():
        cells.nth(i).locator(".jp-OutputArea-output", has_text=text).first.wait_for(
            timeout=scaled_ms(30)
        )
    cells.nth(3).scroll_into_view_if_needed()
    screenshot(page, "grammar-misspelt-option")

    said = cells.nth(1).locator(".jp-OutputArea-output").first.inner_text()
    job_id = int(said.split()[3])
    spec = lab_server.api(f"gpusched/api/jobs/{job_id}")["spec"]
    # the env is the job's, not words passed on to train.py
    assert spec["env"] == {"STEPS": "20"}
    assert spec["command"] == ["python3", "train.py"]
    help_text = cells.nth(2).locator(".jp-OutputArea-output").first.inner_text()
    assert "--gpu-mem" in help_text and "%%%" not in help_text
