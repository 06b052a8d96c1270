"""The lab extension's TypeScript unit tests (vitest), run from pytest so `make test` runs them.

`make`'s setup (`pip install -e .`) runs `jlpm install` in labextension/ through the build
hook, so node_modules is there; if it is not (a wheel install), `jlpm install` fetches it
from the npm registry first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "labextension"
BIN = Path(sys.executable).parent


def _jlpm() -> str:
    found = shutil.which("jlpm", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None or shutil.which("node") is None:
        pytest.skip("jlpm (jupyterlab / jupyter_builder) and node are needed for the TS tests")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "CI": "1"}
    return subprocess.run(
        [_jlpm(), *args], cwd=LAB, env=env, capture_output=True, text=True, timeout=170
    )


@pytest.mark.slow
def test_typescript_unit_tests_pass() -> None:
    if not (LAB / "node_modules" / ".bin" / "vitest").exists():
        install = _run("install")
        assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    result = _run("test")
    report = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in report and "failed" not in report, report


@pytest.mark.slow
def test_typescript_sources_typecheck() -> None:
    result = _run("typecheck")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.slow
def test_typescript_sources_are_formatted() -> None:
    result = _run("prettier:check")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
