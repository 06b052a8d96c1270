"""nbrun, the notebook runner started on a node, run here as the real subprocess it is there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _fixtures_notebooks import outputs_text, read_notebook, write_notebook
from _fixtures_polling import scaled, wait_for

from jupyter_gpusched.core.progress import ProgressFilter, parse_progress, strip_progress
from jupyter_gpusched.node.nbrun import first_line, progress_line


def nbrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpusched.node.nbrun", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ended(proc: subprocess.Popen[str], timeout_s: float = 120) -> str:
    """What ``proc`` printed once it exited (``timeout_s``: a quiet box's seconds); a run
    past that is killed, its pipe closed, and the test fails with what it printed."""
    try:
        return proc.communicate(timeout=scaled(timeout_s))[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        log = proc.communicate()[0]
        raise AssertionError(f"nbrun still ran after {timeout_s:g}s x patience:\n{log}") from None


def progress_of(log: str) -> list[dict]:
    return [d for d in map(parse_progress, log.splitlines()) if d is not None]


@pytest.mark.slow  # a notebook kernel
def test_parameters_without_a_parameters_cell_are_injected_at_the_top(tmp_path: Path) -> None:
    write_notebook(tmp_path / "plain.ipynb", ["print(repr(greeting), repr(times))"])
    proc = nbrun(
        "plain.ipynb",
        "--output",
        "out.ipynb",
        "--parameters",
        json.dumps({"greeting": "hé", "times": 2}),
        cwd=tmp_path,
    )
    log = ended(proc, 120)

    assert proc.returncode == 0, log
    nb = read_notebook(tmp_path / "out.ipynb")
    assert nb.cells[0].metadata["tags"] == ["injected-parameters"]
    assert outputs_text(nb.cells[2]) == "'hé' 2\n"
    assert "'hé' 2" in log  # cell output is echoed into the job's log
    assert progress_of(log)[-1] == {"done": True, "status": "succeeded", "exit_code": 0}


@pytest.mark.slow  # a notebook kernel
def test_the_kernel_talks_over_private_unix_sockets_not_tcp(tmp_path: Path) -> None:
    code = "import ipykernel.kernelapp as k; print(k.IPKernelApp.instance().transport)"
    write_notebook(tmp_path / "where.ipynb", [code])
    proc = nbrun("where.ipynb", "--output", "out.ipynb", cwd=tmp_path)
    log = ended(proc, 120)

    assert proc.returncode == 0, log
    assert "ipc\n" in log
    assert "without encryption" not in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ipynb", "where.ipynb"]


@pytest.mark.slow  # a notebook kernel
def test_the_job_time_limit_saves_the_notebook_and_exits_124(tmp_path: Path) -> None:
    write_notebook(tmp_path / "long.ipynb", ["print('started')", "import time\ntime.sleep(600)"])
    # the limit counts from the job's start: room for the kernel to start on a busy box
    limit = max(4, round(scaled(4)))
    proc = nbrun("long.ipynb", "--output", "out.ipynb", "--job-timeout-s", str(limit), cwd=tmp_path)
    log = ended(proc, 120 + limit)

    assert proc.returncode == 124, log
    nb = read_notebook(tmp_path / "out.ipynb")
    assert outputs_text(nb.cells[1]) == "started\n"
    assert f"time limit of {limit}s" in nb.metadata["gpusched"]["error"]["evalue"]
    assert nb.metadata["gpusched"]["exit_code"] == 124


@pytest.mark.slow  # a notebook kernel
def test_sigterm_saves_what_ran_and_exits_143(tmp_path: Path) -> None:
    write_notebook(tmp_path / "long.ipynb", ["print('one')", "import time\ntime.sleep(60)"])
    proc = nbrun("long.ipynb", "--output", "out.ipynb", cwd=tmp_path)
    assert proc.stdout is not None
    seen: list[str] = []

    def next_line() -> dict[str, Any]:
        seen.append(proc.stdout.readline())  # type: ignore[union-attr]
        return parse_progress(seen[-1]) or {}

    try:
        wait_for(next_line, lambda p: p.get("cell") == 2, interval_s=0, what="the second cell")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    proc.send_signal(signal.SIGTERM)
    rest = ended(proc, 60)

    assert proc.returncode == 143, "".join(seen) + rest
    nb = read_notebook(tmp_path / "out.ipynb")
    assert outputs_text(nb.cells[1]) == "one\n"
    assert nb.cells[2].cell_type == "markdown" and "SIGTERM" in nb.cells[2].source


def test_bad_parameters_exit_2_before_running_anything(tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["print(1)"])
    proc = nbrun("nb.ipynb", "--output", "out.ipynb", "--parameters", "[1, 2]", cwd=tmp_path)
    log = ended(proc, 60)
    assert proc.returncode == 2 and "must be a JSON object" in log
    assert not (tmp_path / "out.ipynb").exists()
    # what a job gets: its parameters in a private file the environment names
    (tmp_path / "parameters.json").write_text("[1, 2]")
    env = {**os.environ, "GPUSCHED_PARAMETERS_FILE": str(tmp_path / "parameters.json")}
    from_env = ("--parameters-env", "GPUSCHED_PARAMETERS_FILE")
    proc = nbrun("nb.ipynb", "--output", "out.ipynb", *from_env, cwd=tmp_path, env=env)
    log = ended(proc, 60)
    assert proc.returncode == 2 and "parameters.json: must be a JSON object" in log
    # promised but not handed over (a node agent older than the scheduler): loud, not defaults
    del env["GPUSCHED_PARAMETERS_FILE"]
    proc = nbrun("nb.ipynb", "--output", "out.ipynb", *from_env, cwd=tmp_path, env=env)
    log = ended(proc, 60)
    assert proc.returncode == 2 and "$GPUSCHED_PARAMETERS_FILE is not set" in log
    assert not (tmp_path / "out.ipynb").exists()
    missing = nbrun("gone.ipynb", "--output", "out.ipynb", cwd=tmp_path)
    log = ended(missing, 60)
    assert missing.returncode == 2 and "gone.ipynb not found" in log


@pytest.mark.slow  # a notebook kernel
def test_the_fallback_input_is_used_when_no_copy_was_staged(tmp_path: Path) -> None:
    shared = write_notebook(tmp_path / "shared" / "nb.ipynb", ["print('from shared')"])
    (tmp_path / "job").mkdir()
    proc = nbrun(
        "nb.ipynb", "--output", "out.ipynb", "--fallback-input", str(shared), cwd=tmp_path / "job"
    )
    log = ended(proc, 120)
    assert proc.returncode == 0, log
    assert outputs_text(read_notebook(tmp_path / "job" / "out.ipynb").cells[1]) == "from shared\n"


def test_progress_lines_round_trip_and_other_lines_are_not_progress() -> None:
    line = progress_line(cell=2, of=5, index=3, source='print("x")  # ✓')
    assert parse_progress(line) == {"cell": 2, "of": 5, "index": 3, "source": 'print("x")  # ✓'}
    assert parse_progress("##gpusched-progress {broken") is None
    assert parse_progress("just output") is None
    assert parse_progress('  ##gpusched-progress {"cell": 1}') is None


def test_the_reported_source_line_is_the_first_line_of_code() -> None:
    assert first_line("\n# load data\n\nx = load()\ny = 2") == "x = load()"
    assert first_line("# only a comment") == "# only a comment"
    assert len(first_line("x = '" + "a" * 500 + "'")) == 200


LOG = (
    b"start\n"
    b'##gpusched-progress {"cell": 1, "of": 2, "source": "x = 1"}\n'
    b"x is 1\n"
    b"##gpusched-progress {broken\n"
    b'##gpusched-progress {"cell": 2, "of": 2, "source": "print(x)"}\n'
    b"  ##gpusched-progress is only a mark at the start of a line\n"
    b"no newline at the end"
)
SHOWN = (
    b"start\nx is 1\n##gpusched-progress {broken\n"
    b"  ##gpusched-progress is only a mark at the start of a line\nno newline at the end"
)


@pytest.mark.parametrize("size", [1, 3, 7, 19, len(LOG)])
def test_logs_for_people_drop_progress_lines_however_the_bytes_arrive(size: int) -> None:
    f = ProgressFilter()
    out = b"".join(f.feed(LOG[i : i + size]) for i in range(0, len(LOG), size)) + f.close()
    assert out == SHOWN == strip_progress(LOG)


def test_a_followed_log_shows_a_partial_line_at_once_unless_it_may_be_a_mark() -> None:
    f = ProgressFilter()
    assert f.feed(b"epoch 1/3 ") == b"epoch 1/3 "
    assert f.feed(b"done\n##gpus") == b"done\n"
    assert f.feed(b'ched-progress {"cell": 1}\nloss 0.1') == b"loss 0.1"
    assert f.close() == b""
