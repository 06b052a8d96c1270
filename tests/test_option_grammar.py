"""One option grammar: the CLI and the ``%gpu`` magic take the same options, and refuse a typo.

A misspelt option is an error naming the one meant, with a non-zero exit, in every
subcommand; options mean the same in both (``--env`` sets the environment, ``--at`` takes the
same words, ``--mem`` is host memory as in Slurm, ``--gpu-mem`` GPU memory); the file a job
runs is checked when it is submitted; every help a message points to works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import nbformat
import pytest
from _fixtures_live_server import api, dir_in_root, notebook
from _fixtures_polling import scaled

from jupyter_gpusched.cli import app as cli
from jupyter_gpusched.cli.base import GpuSchedCommand
from jupyter_gpusched.cli.jobs import SubmitApp
from jupyter_gpusched.cli.notebooks import SubmitNotebookApp
from jupyter_gpusched.client.options import MEM_NOTE

#: A start far enough ahead to wait, near enough for the policy (within a year), in Berlin.
BERLIN_START = datetime.combine(
    (datetime.now(UTC) + timedelta(days=200)).date(), time(3, 4), ZoneInfo("Europe/Berlin")
)
BERLIN_TIME = BERLIN_START.replace(tzinfo=None).isoformat()  # naive: read in --timezone


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["submit", "--gpu", "2", "--", "python", "x.py"],
            "unknown option --gpu; did you mean --gpus?",
        ),
        (["submit", "--gpu=2", "--", "x"], "unknown option --gpu; did you mean --gpus?"),
        (["submit", "--jsn", "--", "x"], "unknown option --jsn; did you mean --json?"),
        (["submit", "--SubmitApp.gpu=2", "--", "x"], "did you mean --SubmitApp.gpus?"),
        (["submit", "--SubmitAp.gpus=2", "--", "x"], "did you mean --SubmitApp.gpus?"),
        (
            ["submit", "--gpus", "1", "python", "train.py", "--lr", "0.1"],
            "unknown option --lr (the command's own options go after '--': "
            "jupyter gpusched submit [OPTIONS] -- COMMAND ARGS...)",
        ),
        (["submit-notebook", "nb.ipynb", "--timezon", "UTC"], "did you mean --timezone?"),
        (["submit-notebook", "nb.ipynb", "--paramter", "a=1"], "did you mean --parameter?"),
        (["queue", "--limt", "3"], "unknown option --limt; did you mean --limit?"),
        (["logs", "1", "--folow"], "unknown option --folow; did you mean --follow?"),
        (["cancel", "--aray", "3"], "unknown option --aray; did you mean --array?"),
        (["nodes", "--jsn"], "unknown option --jsn; did you mean --json?"),
        (["definitions", "--usr", "me"], "unknown option --usr; did you mean --user?"),
        # --prefix where nothing can be written: a run that took the typo installs nothing
        (
            ["kernelspec", "add", "--name", "k", "--gpu", "2", "--prefix", "/dev/null/x"],
            "did you mean --gpus?",
        ),
        (["policy", "--att", "now"], "unknown option --att; did you mean --at?"),
        (["demo", "--frobnicate"], "unknown option --frobnicate"),
        (["--gpus", "2"], "unknown option --gpus"),
        (["simulate", "--jsn"], "unknown option --jsn; did you mean --json?"),
        (["simulate", "--jso"], "unknown option --jso; did you mean --json?"),  # no abbreviation
    ],
)
def test_an_unknown_option_is_an_error_naming_the_one_meant_in_every_subcommand(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message in err and err.count("\n") == 1
    assert "Unrecognized" not in err and "WARNING" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["submit", "--gpu", "2", "--", "python", "train.py"],
            "jupyter gpusched submit: error: unknown option --gpu; did you mean --gpus? "
            "(see jupyter gpusched submit --help)\n",
        ),
        # the service is a Jupyter server of its own: it warned and started without the option
        (
            ["service", "--prot", "1234"],
            "jupyter gpusched service: error: unknown option --prot; did you mean --port? "
            "(see jupyter gpusched service --help)\n",
        ),
        (
            ["service", "--GpuSchedApp.stor_url=sqlite://"],
            "jupyter gpusched service: error: unknown option --GpuSchedApp.stor_url; did you "
            "mean --GpuSchedApp.store_url? (see jupyter gpusched service --help)\n",
        ),
        (
            ["service", "token", "--lst"],
            "jupyter gpusched service token: error: unknown option --lst; did you mean "
            "--list? (see jupyter gpusched service token --help)\n",
        ),
    ],
)
def test_the_installed_command_refuses_a_misspelt_option_instead_of_going_on(
    argv: list[str], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpusched.cli.app", *argv],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", said)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "--", "python", "-u", "missing.py"], "no file 'missing.py' in {cwd}"),
        (["submit", "missing.py"], "no file 'missing.py' in {cwd}"),
        (["submit", "--", "./missing.sh", "--fast"], "no file './missing.sh' in {cwd}"),
        (["submit-notebook", "missing.ipynb"], "no notebook 'missing.ipynb' in {cwd}"),
    ],
)
def test_a_script_or_notebook_that_is_not_there_is_refused_at_submit(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert message.format(cwd=os.getcwd()) in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("app", "command"), [(SubmitApp, "submit"), (SubmitNotebookApp, "submit-notebook")]
)
def test_the_cli_and_the_magic_take_the_same_options(app: Any, command: str) -> None:
    from jupyter_gpusched.client.magics import _PARSERS

    def spelled(keys: Any) -> set[str]:
        keys = keys if isinstance(keys, tuple) else (keys,)
        return {f"-{k}" if len(k) == 1 else f"--{k}" for k in keys}

    common = set(GpuSchedCommand.aliases) | set(GpuSchedCommand.flags)
    cli_options = set().union(
        *(spelled(k) for k in {*app.aliases, *app.flags} - common - {"json", "wait"})
    )
    magic_options = set(_PARSERS[command]._option_string_actions)
    assert cli_options == magic_options
    assert {"--env", "--at", "--timezone", "--gpu-mem", "--mem"} <= magic_options


# ---------------------------------------------------------------------------- against a server


@pytest.fixture
def workdir(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory under the server's root with a script and a notebook; the cwd of the test."""
    where = dir_in_root(live_server, "grammar")
    (where / "job.py").write_text(textwrap.dedent("import os\nprint(os.environ.get('STEPS'))\n"))
    params = notebook("lr = 1.0", "print(lr)")
    params.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(params, where / "params.ipynb")
    monkeypatch.chdir(where)
    return where


def _cancel(live_server: Any, job_id: int) -> None:
    api(live_server, "DELETE", f"jobs/{job_id}")


def test_cli_submit_takes_at_words_timezone_env_and_says_what_mem_means(
    live_server: Any, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ("--url", live_server.url, "--token", live_server.token)
    code, out, err = run(
        capsys,
        *("submit", *server, "--at", BERLIN_TIME, "--timezone", "Europe/Berlin"),
        *("--env", "STEPS=20", "--mem", "2G", "--gpu-mem", "3G", "job.py"),
    )
    assert code == 0, err
    assert err == f"jupyter gpusched submit: note: {MEM_NOTE}\n"
    job = api(live_server, "GET", f"jobs/{out.split()[2]}")
    _cancel(live_server, job["id"])
    spec = job["spec"]
    assert spec["command"] == ["python3", "job.py"]
    assert (spec["env"], spec["mem_gb"], spec["gpu_mem_gb"]) == ({"STEPS": "20"}, 2, 3)
    assert datetime.fromisoformat(spec["not_before"]) == BERLIN_START

    # the words submit-notebook takes: before, a script refused 'tonight' as not an ISO time
    code, out, err = run(capsys, "submit", *server, "--at", "tonight", "--host-mem", "1G", "job.py")
    assert code == 0, err
    assert err == "jupyter gpusched submit: note: --host-mem is deprecated; write --mem\n"
    job = api(live_server, "GET", f"jobs/{out.split()[2]}")
    _cancel(live_server, job["id"])
    assert job["spec"]["mem_gb"] == 1
    start = job["spec"]["not_before"]
    assert start is None or datetime.fromisoformat(start) > datetime.now(UTC)

    code, _, err = run(capsys, "submit", *server, "--at", "0 2 * * *", "job.py")
    assert code == 1 and "a cron expression repeats notebooks only" in err


@pytest.fixture
def shell(live_server: Any) -> Any:
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # None when another module started it
    ip.run_line_magic("load_ext", "jupyter_gpusched")
    ip.run_line_magic("gpu", f"config --url {live_server.url} --token {live_server.token}")
    return ip


def _cell(shell: Any, source: str) -> tuple[Any, str, str]:
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(source)
    return result, captured.stdout, captured.stderr


def test_magic_submit_sets_env_at_and_timezone_instead_of_passing_them_to_the_script(
    live_server: Any, workdir: Path, shell: Any
) -> None:
    result, out, err = _cell(
        shell,
        f"%gpu submit job.py --env STEPS=20 --at {BERLIN_TIME} --timezone Europe/Berlin "
        "-- --lr 0.1",
    )
    assert result.success, err
    job = result.result
    _cancel(live_server, job.id)
    assert job.spec.command == ["python3", "job.py", "--lr", "0.1"]
    assert job.spec.env == {"STEPS": "20"}
    assert job.spec.not_before == BERLIN_START

    # --mem is host memory now: said once per kernel, where it used to mean GPU memory
    for said in (f"%gpu: note: {MEM_NOTE}\n", ""):
        result, out, err = _cell(shell, f"%gpu submit --mem 2G --at {BERLIN_TIME} job.py")
        assert result.success and err == said
        _cancel(live_server, result.result.id)
        assert (result.result.spec.mem_gb, result.result.spec.gpu_mem_gb) == (2, None)

    result, out, err = _cell(
        shell,
        f"%gpu submit-notebook params.ipynb -p lr=0.5 --at {BERLIN_TIME} "
        "--timezone Europe/Berlin --env STEPS=3",
    )
    assert result.success, err
    job = result.result.job
    _cancel(live_server, job.id)
    assert (job.spec.parameters, job.spec.env) == ({"lr": 0.5}, {"STEPS": "3"})
    assert job.spec.not_before == BERLIN_START


@pytest.mark.parametrize(
    ("cell", "line"),
    [
        ("%%gpu --gpu 2\nprint(1)", "unknown option --gpu; did you mean --gpus? (see %gpu --help)"),
        (
            "%%gpu --gpumem 2G\nprint(1)",
            "unknown option --gpumem; did you mean --gpu-mem? (see %gpu --help)",
        ),
        (
            "%gpu submit missing.py --lr 0.1",
            "unknown option --lr (the script's own options go after '--': "
            "%gpu submit [OPTIONS] SCRIPT -- ARGS ...) (see %gpu submit --help)",
        ),
        (
            "%gpu submit missing.py --gpu 2",
            "unknown option --gpu; did you mean --gpus? (see %gpu submit --help)",
        ),
        (
            "%gpu submit-notebook nb.ipynb --timezon UTC",
            "unknown option --timezon; did you mean --timezone? (see %gpu submit-notebook --help)",
        ),
        ("%gpu queue --al", "unknown option --al; did you mean --all? (see %gpu queue --help)"),
        (
            "%gpu logs 3 --folow",
            "unknown option --folow; did you mean --follow? (see %gpu logs --help)",
        ),
        (
            "%%gpu --gpus 1 extra\nprint(1)",
            "%%gpu takes options only, not 'extra' (see %gpu --help)",
        ),
    ],
)
def test_a_misspelt_magic_option_is_an_error_naming_the_one_meant(
    shell: Any, cell: str, line: str
) -> None:
    result, out, err = _cell(shell, cell)
    assert not result.success
    assert (out, err) == ("", f"UsageError: {line}\n")


@pytest.mark.parametrize(
    ("cell", "usage"),
    [
        ("%gpu --help", "usage: %%gpu [OPTIONS]"),
        ("%%gpu --help\npass", "usage: %%gpu [OPTIONS]"),
        ("%gpu submit --help", "usage: %gpu submit [OPTIONS] SCRIPT [ARGS ...] [-- ARGS ...]"),
        ("%gpu submit-notebook --help", "usage: %gpu submit-notebook [OPTIONS] NOTEBOOK"),
        ("%gpu cancel --help", "usage: %gpu cancel ID [ID ...]"),
        ("%gpu release --help", "usage: %gpu release [--lease LEASE] [--all]"),
    ],
)
def test_every_help_a_message_points_to_works_and_names_the_magic_once(
    shell: Any, cell: str, usage: str
) -> None:
    result, out, err = _cell(shell, cell)
    assert result.success and err == ""
    assert usage in out.splitlines()
    assert "%%%" not in out and "::" not in out
    assert "%%%" not in shell.find_magic("gpu").__doc__


def test_the_api_names_the_field_meant_for_a_misspelt_one(live_server: Any) -> None:
    from jupyter_gpusched.client.api import ApiError, GpuSchedClient

    client = GpuSchedClient(live_server.url, live_server.token)
    with pytest.raises(ApiError) as refused:
        client.submit(kind="script", command=["true"], gpu=2)
    assert refused.value.status == 422
    assert refused.value.message == "gpu: unknown field; did you mean 'gpus'?"
    with pytest.raises(ApiError, match=r"at: a cron expression repeats notebooks only"):
        client.submit(kind="script", command=["true"], at="0 2 * * *")
