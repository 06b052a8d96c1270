"""The example notebooks run top to bottom on the embedded cluster of a live server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest

pytest.register_assert_rewrite("_fixtures_server", "_fixtures_live_server")
from _fixtures_live_server import dir_in_root, execute, outputs, text  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, server: Any) -> Any:
    """Run an example where a user's notebook is: in a folder under the server's root."""
    folder = dir_in_root(server, name.split("_", 1)[0])
    shutil.copy(EXAMPLES / name, folder / name)
    nb = nbformat.read(folder / name, as_version=4)
    # allow_errors=False: any failing cell not tagged raises-exception fails the run
    return execute(nb, server, folder, allow_errors=False)


def _expected_errors(nb: Any) -> list[str]:
    return [
        o["traceback"][-1]
        for c in nb.cells
        if c.cell_type == "code"
        for o in outputs(c, "error")
        if "raises-exception" in c.metadata.get("tags", [])
    ]


ALL = (
    "01_run_a_cell_on_a_gpu.ipynb",
    "02_watch_fragmentation.ipynb",
    "03_submit_a_script.ipynb",
    "04_schedule_a_notebook.ipynb",
)


def test_examples_are_found() -> None:
    assert set(ALL) == {p.name for p in EXAMPLES.glob("*.ipynb")}


def test_run_a_cell_on_a_gpu(live_server: Any) -> None:
    nb = _run("01_run_a_cell_on_a_gpu.ipynb", live_server)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "CUDA_VISIBLE_DEVICES = GPU-" in text(code[1])
    assert text(code[4]).startswith("mean weight: ")
    errors = _expected_errors(nb)
    assert len(errors) == 1 and "ZeroDivisionError" in errors[0]
    assert text(code[-1]).startswith("%gpu: released lease ")


def test_watch_fragmentation(live_server: Any) -> None:
    nb = _run("02_watch_fragmentation.ipynb", live_server)
    code = [c for c in nb.cells if c.cell_type == "code"]
    (view,) = outputs(code[1], "execute_result")
    assert "application/vnd.jupyter.widget-view+json" in view["data"]
    assert "largest_placeable_gpus" in outputs(code[3], "execute_result")[0]["data"]["text/plain"]


def test_submit_a_script(live_server: Any) -> None:
    nb = _run("03_submit_a_script.ipynb", live_server)
    code = [c for c in nb.cells if c.cell_type == "code"]
    logs = text(code[4])
    assert "epoch 2 on 2 GPU(s)" in logs and logs.rstrip().endswith("done")
    # a refused request is one line (IPython's UsageError), not a traceback
    assert _expected_errors(nb) == []
    assert text(code[-1]).startswith("UsageError: this job can never fit")
    assert text(code[-1]).count("\n") == 1


def test_schedule_a_notebook(live_server: Any) -> None:
    nb = _run("04_schedule_a_notebook.ipynb", live_server)
    code = [text(c) for c in nb.cells if c.cell_type == "code"]
    assert code[3].startswith("succeeded\ntrain-") and code[3].rstrip().endswith(".ipynb")
    assert code[4].splitlines() == [
        "wide: lr=0.5 (float), layers=[64, 32] on 1 GPU(s)",
        "epoch 0: loss 1.000",
        "epoch 1: loss 0.667",
        "epoch 2: loss 0.500",
    ]
    assert [json.loads(line.split(" ", 1)[1]).get("cell") for line in code[5].splitlines()] == [
        1,
        2,
        3,
        4,
        None,
    ]
    # a failed job's reason is its last error line (issue #32), with the exit code
    assert code[6].startswith("failed ZeroDivisionError: division by zero (exit code 1)") and code[
        6
    ].rstrip().endswith("ZeroDivisionError")
    assert "(Europe/Berlin; cron '0 2 * * *', catch-up once;" in code[8]
    assert code[9].splitlines() == ["None", "True", "[]"]


@pytest.mark.parametrize("name", ALL)
def test_examples_are_stored_without_outputs(name: str) -> None:
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
