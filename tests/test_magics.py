"""``%%gpu`` end to end: a real kernel runs a notebook against a live server and its cluster.

The notebook runs once per module (one server, one lease); each test reads the cells it is
about.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_gpusched.client.leases import discover
from jupyter_gpusched.client.lines import waiting_line
from jupyter_gpusched.core.api import JobView, Window

pytest.register_assert_rewrite("_fixtures_server", "_fixtures_live_server")
from _fixtures_live_server import (  # noqa: E402
    api,
    dir_in_root,
    execute,
    notebook,
    outputs,
    text,
)
from _fixtures_polling import wait_for  # noqa: E402

PNG_CELL = """%%gpu
import struct, zlib
from IPython.display import HTML, Image, display
def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
raw = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * 2 for _ in range(2))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
display(Image(data=png))
display(HTML("<b>made on the node</b>"))
handle = display(HTML("<i>step 0</i>"), display_id=True)
handle.update(HTML("<i>step 1</i>"))
6 * 7"""

CELLS = {
    "load": "%load_ext jupyter_gpusched",
    "local": "import os, json\nprint(json.dumps({'pid': os.getpid()}))",
    "remote": (
        "%%gpu --gpus 1\nimport os, json\nx = 41\n"
        "print(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(),"
        " 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
        " 'node': os.environ.get('GPUSCHED_SIM_NODE')}))"
    ),
    "persist": "%%gpu\nprint('x + 1 =', x + 1)",
    # a cell asking for more than the lease it would run on is told so, not run there
    "mismatch": "%%gpu --gpus 2\nprint('never')",
    "same_again": "%%gpu --gpus 1\nprint('same lease, x is', x)",
    "zero": "%%gpu --gpus 0\nprint('never')",
    "too_many": "%%gpu --gpus 99 --lease big\nprint('never')",
    "outputs": PNG_CELL,
    "error": "%%gpu\ndef inner():\n    return 1 / 0\ninner()",
    "interrupt": "%%gpu\nprint('spinning', flush=True)\nwhile True:\n    pass",
    "after_interrupt": "%%gpu\nprint('still here:', x)",
    # the lease ends behind the notebook's back, as an idle reclaim would end it
    "reclaim": (
        "from jupyter_gpusched.client.api import GpuSchedClient\n"
        "client = GpuSchedClient.discover()\n"
        "for held in client.leases():\n    client.release(held.id)"
    ),
    "after_reclaim": "%%gpu\nprint('fresh kernel:', 'x' not in globals())",
    "bad_arg": "%%gpu --gpus many\nprint('never')",
    "bad_command": "%gpu frobnicate",
    "infeasible": "%%gpu --gpus 64 --lease huge\nprint('never')",
    # every free A100 is taken by a batch job that ends 1.5 s later: the next lease waits
    "block": (
        "import sys, threading, time\n"
        "free = [g for n in client.cluster().nodes for g in n.gpus\n"
        "        if g.model.startswith('A100') and g.state == 'free']\n"
        "blocker = client.submit(kind='script', gpus=len(free), gpu_models=['A100'],\n"
        "                        command=[sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "while client.get_job(blocker.id).state != 'running':\n"
        "    time.sleep(0.05)\n"
        "threading.Timer(1.5, client.cancel, [blocker.id]).start()"
    ),
    "waiter": "%%gpu --model A100 --lease waiter\nprint('got an A100')",
    "submit": "%gpu submit job.py --gpus 1 -- --greeting hi",
    "submit_nb": "%gpu submit-notebook params.ipynb -p lr=0.1 -p tag=base --gpus 1",
    "queue": "%gpu queue --all",
    "release": "%gpu release --all",
}


def _run(live_server: Any, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "job.py").write_text(
        textwrap.dedent("""
        import os, sys
        print('job args', sys.argv[1:], 'cwd', os.getcwd(), flush=True)
    """)
    )
    params = notebook("lr = 1.0\ntag = 'x'", "print('lr', lr, type(lr).__name__, tag)")
    params.cells[0].metadata["tags"] = ["parameters"]
    params.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(params, tmp_path / "params.ipynb")
    nb = notebook(*CELLS.values())
    # the spinning cell is interrupted after its time is up, as Ctrl-C would
    execute(
        nb,
        live_server,
        tmp_path,
        timeout_func=lambda cell: 3 if "while True" in cell.source else 120,
    )
    return dict(zip(CELLS, nb.cells, strict=True))


@pytest.fixture(scope="module")
def notebook_dir(live_server: Any) -> Path:
    return dir_in_root(live_server, "nb")


@pytest.fixture(scope="module")
def cells(live_server: Any, notebook_dir: Path) -> dict[str, Any]:
    return _run(live_server, notebook_dir)


@pytest.fixture(scope="module")
def leases(cells: dict[str, Any], live_server: Any, notebook_dir: Path) -> list[dict[str, Any]]:
    """This notebook's default leases, oldest first: the first one, and its replacement."""
    jobs = api(live_server, "GET", "jobs?kind=lease&limit=200")["jobs"]
    found = [
        j
        for j in jobs
        if j["spec"]["env"].get("GPUSCHED_KERNEL_CWD") == str(notebook_dir)
        and j["spec"].get("lease_name", "").endswith(":default")
    ]
    return sorted(found, key=lambda j: j["id"])


@pytest.fixture(scope="module")
def lease(leases: list[dict[str, Any]]) -> dict[str, Any]:
    return leases[0]


@pytest.fixture(scope="module")
def waiter(cells: dict[str, Any], live_server: Any, notebook_dir: Path) -> dict[str, Any]:
    jobs = api(live_server, "GET", "jobs?kind=lease&limit=200")["jobs"]
    (found,) = [
        j
        for j in jobs
        if j["spec"]["env"].get("GPUSCHED_KERNEL_CWD") == str(notebook_dir)
        and j["spec"].get("lease_name", "").endswith(":waiter")
    ]
    return found


def _json_line(cell: Any) -> dict[str, Any]:
    line = next(ln for ln in text(cell).splitlines() if ln.startswith("{"))
    return json.loads(line)


def test_the_remote_cell_sees_its_gpus_and_runs_in_another_process_on_the_node(
    cells: dict[str, Any], lease: dict[str, Any]
) -> None:
    local, remote = _json_line(cells["local"]), _json_line(cells["remote"])
    placement = lease["placement"]
    assert remote["cuda"] == ",".join(placement["gpu_uuids"])
    assert remote["node"] == placement["node"]
    assert remote["pid"] not in (local["pid"], os.getpid())
    assert remote["ppid"] != local["pid"]


def test_the_first_cell_says_where_the_lease_runs(
    cells: dict[str, Any], lease: dict[str, Any]
) -> None:
    shown = [o["data"]["text/plain"] for o in outputs(cells["remote"], "display_data")]
    assert shown == [
        f"%%gpu: lease {lease['id']} running on {lease['placement']['node']} "
        f"GPU {lease['placement']['gpu_indices'][0]}"
    ]


def test_a_variable_set_in_one_gpu_cell_is_read_in_the_next(cells: dict[str, Any]) -> None:
    assert text(cells["persist"]) == "x + 1 = 42\n"


def test_images_html_display_updates_and_the_result_arrive(cells: dict[str, Any]) -> None:
    cell = cells["outputs"]
    shown = outputs(cell, "display_data")
    assert shown[0]["data"]["image/png"]  # base64 of the remote PNG
    assert shown[1]["data"]["text/html"] == "<b>made on the node</b>"
    # nbclient applies update_display_data in place
    assert shown[2]["data"]["text/html"] == "<i>step 1</i>"
    result = outputs(cell, "execute_result")
    assert [r["data"]["text/plain"] for r in result] == ["42"]


def test_an_exception_shows_the_remote_traceback_only(cells: dict[str, Any]) -> None:
    (error,) = outputs(cells["error"], "error")
    assert error["ename"] == "ZeroDivisionError"
    assert error["evalue"] == "division by zero"
    trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert "inner()" in trace and "1 / 0" in trace
    assert "magics.py" not in trace and "run_cell_magic" not in trace


def test_interrupt_stops_a_busy_remote_cell_and_the_kernel_lives_on(cells: dict[str, Any]) -> None:
    assert "spinning" in text(cells["interrupt"])
    (error,) = outputs(cells["interrupt"], "error")
    assert error["ename"] == "KeyboardInterrupt"
    assert text(cells["after_interrupt"]) == "still here: 41\n"


@pytest.mark.parametrize(
    ("key", "line"),
    [
        ("bad_arg", "argument --gpus: 'many' is not a whole number (see %gpu --help)"),
        (
            "bad_command",
            "unknown command 'frobnicate'; use one of release, status, "
            "queue, submit, submit-notebook, cancel, logs, leases, config",
        ),
    ],
)
def test_argument_errors_are_one_line(cells: dict[str, Any], key: str, line: str) -> None:
    assert outputs(cells[key], "error") == []  # no traceback
    assert text(cells[key]) == f"UsageError: {line}\n"


def test_a_cell_asking_for_other_gpus_than_its_lease_is_told_and_not_run(
    cells: dict[str, Any], lease: dict[str, Any]
) -> None:
    assert outputs(cells["mismatch"], "error") == []
    assert text(cells["mismatch"]) == (
        f"UsageError: this notebook's lease {lease['id']} holds 1 GPU; this cell asks for "
        "2 GPUs. Run %gpu release first (the lease's variables are lost), then run this cell "
        "again; or give --lease NAME for a second lease\n"
    )
    assert text(cells["same_again"]) == "same lease, x is 41\n"


@pytest.mark.parametrize(
    ("key", "line"),
    [
        ("zero", "--gpus 0: a %%gpu cell needs at least 1 GPU (run CPU-only code without %%gpu)"),
        (
            "too_many",
            "--gpus: must be at most 64 (the per-job cap on GPUs), not 99; the largest node "
            "here has 4 GPUs (g0): ask for 4 or fewer",
        ),
    ],
)
def test_bad_values_get_one_plain_line(cells: dict[str, Any], key: str, line: str) -> None:
    assert outputs(cells[key], "error") == []
    assert text(cells[key]) == f"UsageError: {line}\n"


def test_a_request_that_can_never_fit_fails_at_once_saying_why(cells: dict[str, Any]) -> None:
    assert outputs(cells["infeasible"], "error") == []
    said = text(cells["infeasible"])
    assert said.startswith("UsageError: this job can never fit") and said.count("\n") == 1


def test_submit_runs_the_script_in_the_notebook_directory(
    cells: dict[str, Any], live_server: Any
) -> None:
    said = text(cells["submit"])
    assert said.startswith("%gpu: submitted job ")
    job_id = int(said.split()[3])
    # the magic's value (a trailing %gpu submit shows it) is one line, not the whole job
    (shown,) = outputs(cells["submit"], "execute_result")
    assert shown["data"]["text/plain"] == f"<Job {job_id} queued: job.py>"
    job = api(live_server, "GET", f"jobs/{job_id}")
    assert job["spec"]["command"] == ["python3", "job.py", "--greeting", "hi"]
    job = wait_for(
        lambda: api(live_server, "GET", f"jobs/{job_id}"),
        lambda job: job["state"] in ("succeeded", "failed"),
        timeout_s=10,
        what=f"job {job_id} to end",
    )
    assert job["state"] == "succeeded", job
    assert job["spec"]["workdir"] == str(Path(job["spec"]["files"][0]).parent)


def test_submit_notebook_runs_it_with_typed_parameters_and_writes_the_result_beside_it(
    cells: dict[str, Any], live_server: Any, notebook_dir: Path
) -> None:
    said = text(cells["submit_nb"])
    assert said.startswith("%gpu: submitted params.ipynb as job "), said
    job_id = int(said.split()[5])
    job = wait_for(
        lambda: api(live_server, "GET", f"jobs/{job_id}"),
        lambda job: bool(job["outputs"]),
        timeout_s=90,
        interval_s=0.2,
        what="the executed notebook",
    )
    assert job["state"] == "succeeded", job
    assert job["spec"]["parameters"] == {"lr": 0.1, "tag": "base"}
    executed = nbformat.read(live_server.root / job["outputs"]["notebook"], as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "lr 0.1 float base" in printed


def test_queue_lists_the_lease(cells: dict[str, Any], lease: dict[str, Any]) -> None:
    assert f"\n{lease['id']} " in "\n" + text(cells["queue"])


def test_a_lease_ended_elsewhere_is_said_in_one_line_and_replaced(
    cells: dict[str, Any], leases: list[dict[str, Any]]
) -> None:
    first, second = leases
    assert text(cells["after_reclaim"]) == (
        f"%gpu: lease {first['id']} ended (cancelled by {first['user']}); "
        "requesting a new one (variables set on it are gone)\nfresh kernel: True\n"
    )
    assert outputs(cells["after_reclaim"], "error") == []
    assert second["spec"]["lease_name"] == first["spec"]["lease_name"]


def test_a_waiting_lease_shows_one_line_updated_until_it_runs(
    cells: dict[str, Any], waiter: dict[str, Any]
) -> None:
    shown = outputs(cells["waiter"], "display_data")
    # one display, updated in place from the waiting line to this one
    assert [o["data"]["text/plain"] for o in shown] == [
        f"%%gpu: lease {waiter['id']} running on g0 GPU {waiter['placement']['gpu_indices'][0]}"
    ]
    assert text(cells["waiter"]) == "got an A100\n"


def test_the_waiting_line_says_position_reason_and_window() -> None:
    job = JobView.model_validate(
        {
            "id": 9,
            "state": "queued",
            "position": 2,
            "user": "alice",
            "priority_class": "interactive",
            "submitted_at": "2026-11-23T10:00:00+00:00",
            "spec": {"kind": "lease", "gpus": 2, "user": "alice"},
            "reason": "waiting: no room (no node has 2 free GPUs)",
        }
    )
    window = Window.model_validate(
        {
            "name": "day",
            "applies": "Mon-Fri 08:00-20:00",
            "since": None,
            "until": "2026-11-23T20:00:00+00:00",
            "next_window": "night",
            "interactive_reserved_share": 0.25,
            "interactive_max_share": 0.75,
            "batch_max_runtime_s": None,
            "lease_idle_timeout_s": None,
            "preempt_batch": False,
            "migrate_batch": False,
            "interactive_first": True,
            "rules": [],
        }
    )
    now = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    assert waiting_line(job, window, now, UTC) == (
        "%%gpu: waiting for lease 9 (2 GPUs) | 2nd in line | starts unknown | no room (no node "
        "has 2 free GPUs) | day window until 20:00, then night"
    )
    soon = job.model_copy(update={"estimated_start": now + timedelta(minutes=12)})
    assert " | 2nd in line | starts in 12m (10:12) | " in waiting_line(soon, None, now, UTC)


def test_release_frees_the_gpus(
    cells: dict[str, Any],
    leases: list[dict[str, Any]],
    waiter: dict[str, Any],
    live_server: Any,
) -> None:
    held = [leases[-1], waiter]
    assert text(cells["release"]) == (
        f"%gpu: released lease {', '.join(str(j['id']) for j in held)}\n"
    )
    nodes = {n["name"]: n for n in api(live_server, "GET", "cluster")["nodes"]}
    for lease in held:
        assert api(live_server, "GET", f"jobs/{lease['id']}")["state"] == "cancelled"
        for index in lease["placement"]["gpu_indices"]:
            gpu = nodes[lease["placement"]["node"]]["gpus"][index]
            assert gpu["state"] == "free" and gpu["jobs"] == []


def test_the_magic_finds_its_parent_server_in_the_runtime_dir(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUSCHED_URL", raising=False)
    info = discover(str(live_server.root / "runtime"), {live_server.proc.pid})
    assert (info.url, info.token) == (live_server.url, live_server.token)


# ---------------------------------------------------------------------------- no kernel, no server


@pytest.fixture(scope="module")
def shell() -> Any:
    from IPython.testing.globalipapp import get_ipython, start_ipython

    ip = start_ipython() or get_ipython()  # None when another module started it
    ip.run_line_magic("load_ext", "jupyter_gpusched")
    return ip


@pytest.mark.parametrize(
    ("cell", "line"),
    [
        (
            "%%gpu --gpus -3\nprint(1)",
            "argument --gpus: must be 0 or more, got -3 (see %gpu --help)",
        ),
        (
            "%%gpu --mem lots\nprint(1)",
            "argument --mem: 'lots' is not a size; write it like 16G, 512M or 24 (see %gpu --help)",
        ),
        (
            "%%gpu --max-runtime soon\nprint(1)",
            "argument --max-runtime: 'soon' is not a "
            "duration; write it like 90s, 15m, 2h or 1h30m "
            "(see %gpu --help)",
        ),
        (
            "%%gpu --lease\nprint(1)",
            "argument --lease: expected one argument (see %gpu --help)",
        ),
        ("%gpu submit", "give the script to run, e.g. %gpu submit --gpus 1 train.py"),
        ("%gpu submit missing.py", "no file 'missing.py' in {cwd}"),
        ("%gpu cancel one", "argument ID: 'one' is not a whole number (see %gpu cancel --help)"),
        ("%gpu logs 'unclosed", "cannot read the arguments: No closing quotation"),
    ],
)
def test_bad_arguments_print_one_line_in_the_ipython_shell(
    shell: Any, cell: str, line: str
) -> None:
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(cell)
    assert not result.success
    assert captured.stdout == ""
    assert captured.stderr == f"UsageError: {line.format(cwd=os.getcwd())}\n"


@pytest.mark.slow  # imports the whole server in a fresh interpreter
def test_importing_the_server_extension_does_not_import_ipython() -> None:
    import subprocess
    import sys

    code = (
        "import sys, jupyter_gpusched, jupyter_gpusched.server.app, "
        "jupyter_gpusched.server.handlers.base, jupyter_gpusched.scheduling.scheduler; "
        "print('IPython' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
