"""What the tools print is only what they mean to (issue #32).

``jupyter gpusched simulate --json`` was no JSON: HiGHS printed its banner on stdout, from C++
(so ``capsys`` never saw it), and the same banner was logged at every service start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """This checkout first on the path: the subprocess runs the code under test."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


PRICE_A_MIX = """
from jupyter_gpusched.packing.mix import ShapeMix
from jupyter_gpusched.packing.packer import PackRequest
from jupyter_gpusched.packing.pricing import slot_value
value = slot_value(ShapeMix((PackRequest(1, 0.81), PackRequest(1, 0.32)), (1.0, 1.0)))
assert value[810] > 0
"""


def test_pricing_gpu_shares_prints_nothing_on_stdout() -> None:
    # a fresh process: HiGHS prints its banner once per process, at the first solver built
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PRICE_A_MIX], capture_output=True, env=env, timeout=120, check=True
    )
    assert done.stdout == b"" and done.stderr == b""


DATA = ROOT.parent / "shared" / "data" / "openb"


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no openb trace in {DATA}")
def test_simulate_json_is_json_from_the_first_byte(tmp_path: Path) -> None:
    lines = (DATA / "openb_pod_list_default.csv").read_text().splitlines()[:300]
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("\n".join(lines) + "\n")
    argv = ["simulate", "--data-dir", str(DATA), "--tasks", str(tasks), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpusched.cli.app", *argv, "--policy", "fragmentation"],
        capture_output=True,
        env=_env(),
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout)["results"]["fragmentation"]["alloc_pct"]
