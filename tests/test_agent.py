"""The node agent, run as the CLI it is on a node (no SSH in between)."""

from __future__ import annotations

import io
import json
import os
import pwd
import stat
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import scaled, wait_for
from _fixtures_ssh import REPO_ROOT, fake_gpu_bin, gpu_state, kill_marked

from jupyter_gpusched.node.probe import short_model


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Environment of a fake node: a GPU state file, no nvidia-smi, a marker for cleanup."""
    token = uuid.uuid4().hex
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps(gpu_state(4)))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO_ROOT),
        "GPUSCHED_TEST_RUN": token,
        "JPY_PARENT_PID": "12345",
    }
    yield {"env": env, "state": state, "dir": tmp_path}
    kill_marked(token)


AGENT = [sys.executable, "-m", "jupyter_gpusched.node.agent"]


def agent(env: dict[str, str], *args: str, check: bool = True) -> Any:
    done = subprocess.run(
        [*AGENT, *args],
        env=env,
        capture_output=True,
        timeout=scaled(60),
    )
    if check:
        assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def launch_sh(node: dict[str, Any], name: str, script: str) -> Any:
    """Launch ``sh -c script`` in job dir ``name`` of the node; the agent's answer."""
    return agent(
        node["env"], "launch", "--job-dir", str(node["dir"] / name), "--", "sh", "-c", script
    )


def wait_ended(env: dict[str, str], job: dict[str, Any]) -> dict[str, Any]:
    args = ["--job-dir", job["job_dir"], "--pid", str(job["pid"])]
    return dict(
        wait_for(
            lambda: agent(env, "status", *args, "--start-time", str(job["start_time"])),
            lambda answer: not answer["running"],
            timeout_s=20,
            what="the job to end",
        )
    )


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_gpu_model_names_are_shortened(name: str, model: str) -> None:
    assert short_model(name) == model


def test_probe_without_driver_or_nvidia_smi_reports_no_gpus(node: dict[str, Any]) -> None:
    answer = agent(node["env"], "probe")
    assert answer["source"] == "none"
    assert answer["gpus"] == []
    assert answer["cpus"] >= 1 and answer["mem_gb"] > 0


def test_probe_through_simulated_nvml(node: dict[str, Any]) -> None:
    foreign = [{"gpu_index": 2, "pid": 4_100_001, "mem_mb": 2048, "name": "python"}]
    node["state"].write_text(json.dumps(gpu_state(4, foreign)))
    env = {
        **node["env"],
        "GPUSCHED_NVML_MODULE": "jupyter_gpusched.cluster.sim.nvml",
        "GPUSCHED_SIM_STATE": str(node["state"]),
    }
    answer = agent(env, "probe")
    assert answer["source"] == "nvml"
    assert (answer["cpus"], answer["mem_gb"]) == (32, 256)
    gpus = answer["gpus"]
    assert [g["model"] for g in gpus] == ["A100-80GB"] * 4
    assert [g["uuid"] for g in gpus] == [g["uuid"] for g in gpu_state(4)["gpus"]]
    assert [g["nvlink_peers"] for g in gpus] == [[1], [0], [3], [2]]
    assert gpus[0]["mem_total_mb"] == 81920
    assert gpus[2]["processes"] == [
        {"pid": 4_100_001, "used_mem_mb": 2048, "name": "", "job_id": None, "user": None}
    ]
    assert gpus[2]["mem_used_mb"] == 2048
    assert gpus[0]["power_w"] == 55.0


def test_probe_falls_back_to_nvidia_smi_csv(node: dict[str, Any]) -> None:
    foreign = [{"gpu_index": 1, "pid": 4_100_002, "mem_mb": 1000, "name": "/usr/bin/python3"}]
    state = gpu_state(4, foreign)
    state["gpus"][3]["power_na"] = True
    node["state"].write_text(json.dumps(state))
    bindir = fake_gpu_bin(node["dir"])
    env = {
        **node["env"],
        "PATH": f"{bindir}:/usr/bin:/bin",
        "FAKE_NVIDIA_SMI_STATE": str(node["state"]),
    }
    answer = agent(env, "probe")
    assert answer["source"] == "nvidia-smi"
    gpus = answer["gpus"]
    assert [(g["index"], g["model"], g["mem_total_mb"]) for g in gpus] == [
        (i, "A100-80GB", 81920) for i in range(4)
    ]
    assert [g["nvlink_peers"] for g in gpus] == [[1], [0], [3], [2]]
    assert gpus[1]["processes"] == [
        {"pid": 4_100_002, "used_mem_mb": 1000, "name": "python3", "job_id": None, "user": None}
    ]
    assert gpus[1]["mem_used_mb"] == 1000 and gpus[1]["util_pct"] == 87
    assert gpus[0]["power_w"] == 55.25 and gpus[3]["power_w"] is None


def test_job_processes_carry_their_job_id_and_others_do_not(node: dict[str, Any]) -> None:
    bindir = fake_gpu_bin(node["dir"])
    env = {
        **node["env"],
        "PATH": f"{bindir}:/usr/bin:/bin",
        "FAKE_NVIDIA_SMI_STATE": str(node["state"]),
    }
    uuids = [g["uuid"] for g in gpu_state(4)["gpus"]]
    job = agent(
        env,
        "launch",
        "--job-dir",
        str(node["dir"] / "job7"),
        "--gpus",
        uuids[0],
        "--env",
        "GPUSCHED_JOB_ID=7",
        "--",
        "sleep",
        "30",
    )
    outsider = subprocess.Popen(["sleep", "30"], env={**env, "CUDA_VISIBLE_DEVICES": uuids[3]})
    try:
        gpus = agent(env, "probe")["gpus"]
    finally:
        outsider.kill()
        outsider.wait()
        agent(env, "kill", "--pgid", str(job["pgid"]), "--grace", "1")
    assert [(p["pid"], p["job_id"]) for p in gpus[0]["processes"]] == [(job["pgid"], 7)]
    assert [(p["pid"], p["job_id"]) for p in gpus[3]["processes"]] == [(outsider.pid, None)]
    # whose it is, for the scheduler to tell jobs whose environment it cannot read
    assert gpus[3]["processes"][0]["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert gpus[1]["processes"] == [] and gpus[2]["processes"] == []


def test_launch_runs_detached_with_env_cwd_and_records_exit_code(node: dict[str, Any]) -> None:
    workdir = node["dir"] / "work"
    workdir.mkdir()
    script = (
        "import os; print('cwd', os.getcwd());"
        " print('cvd', os.environ['CUDA_VISIBLE_DEVICES']);"
        " print('jpy', os.environ.get('JPY_PARENT_PID')); print('x', os.environ['X']);"
        " print('sid', os.getsid(0) == os.getsid(os.getppid())); print(os.getsid(0));"
        " raise SystemExit(3)"
    )
    job = agent(
        node["env"],
        "launch",
        "--job-dir",
        str(node["dir"] / "j1"),
        "--cwd",
        str(workdir),
        "--gpus",
        "GPU-a,GPU-b",
        "--env",
        "X=a b;c",
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert job["pgid"] != job["pid"] and job["start_time"] > 0 and not job["reused"]
    ended = wait_ended(node["env"], job)
    assert ended["exit_code"] == 3 and ended["ended_at"].endswith("+00:00")
    *log, sid = Path(job["log"]).read_text().splitlines()
    assert log == [f"cwd {workdir}", "cvd GPU-a,GPU-b", "jpy None", "x a b;c", "sid True"]
    assert int(sid) != os.getsid(0)  # the wrapper's session is not the one it was started from


def test_launching_the_same_job_dir_twice_returns_the_first_launch(node: dict[str, Any]) -> None:
    args = ["launch", "--job-dir", str(node["dir"] / "j2"), "--", "sleep", "30"]
    first = agent(node["env"], *args)
    second = agent(node["env"], *args)
    agent(node["env"], "kill", "--pgid", str(first["pgid"]), "--grace", "1")
    assert second["reused"] and second["pid"] == first["pid"]


def test_a_missing_program_ends_with_127_and_says_why(node: dict[str, Any]) -> None:
    job = agent(
        node["env"], "launch", "--job-dir", str(node["dir"] / "j3"), "--", "no-such-program-xyz"
    )
    assert wait_ended(node["env"], job)["exit_code"] == 127
    assert "cannot start 'no-such-program-xyz'" in Path(job["log"]).read_text()


def test_kill_terms_the_group_and_the_wrapper_records_the_signal(node: dict[str, Any]) -> None:
    job = launch_sh(node, "j4", "sleep 30 & sleep 30; wait")
    assert agent(
        node["env"],
        "status",
        "--job-dir",
        job["job_dir"],
        "--pid",
        str(job["pid"]),
        "--start-time",
        str(job["start_time"]),
    )["running"]
    result = agent(
        node["env"], "kill", "--pgid", str(job["pgid"]), "--grace", "5", "--job-dir", job["job_dir"]
    )
    assert result == {"terminated": True, "killed": False}
    assert wait_ended(node["env"], job)["exit_code"] == -15


def test_kill_escalates_to_sigkill_after_the_grace_period(node: dict[str, Any]) -> None:
    job = launch_sh(node, "j5", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    wait_for(lambda: b"ready" in Path(job["log"]).read_bytes(), interval_s=0.02, what="ready")
    result = agent(
        node["env"],
        "kill",
        "--pgid",
        str(job["pgid"]),
        "--grace",
        "0.3",
        "--job-dir",
        job["job_dir"],
    )
    assert result == {"terminated": True, "killed": True}
    assert wait_ended(node["env"], job)["exit_code"] == -9


def test_a_reused_pid_does_not_count_as_the_job(node: dict[str, Any]) -> None:
    job = agent(node["env"], "launch", "--job-dir", str(node["dir"] / "j6"), "--", "sleep", "30")
    wrong = agent(
        node["env"],
        "status",
        "--job-dir",
        job["job_dir"],
        "--pid",
        str(job["pid"]),
        "--start-time",
        str(job["start_time"] - 1),
    )
    agent(node["env"], "kill", "--pgid", str(job["pgid"]), "--grace", "1")
    assert wrong == {"running": False, "exit_code": None, "ended_at": None}


def test_log_reads_from_an_offset_and_follow_streams_until_the_end(node: dict[str, Any]) -> None:
    job = launch_sh(node, "j7", "echo one; sleep 0.5; echo two")
    # a follower stops at EOF on stdin (its SSH channel closed), so keep stdin open
    with subprocess.Popen(
        [
            *AGENT,
            "log",
            "--file",
            job["log"],
            "--follow",
            "--job-dir",
            job["job_dir"],
            "--pid",
            str(job["pid"]),
            "--start-time",
            str(job["start_time"]),
        ],
        env=node["env"],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
    ) as follower:
        assert follower.stdout is not None
        streamed = follower.stdout.read()
    assert follower.returncode == 0
    assert streamed == b"one\ntwo\n"
    part = subprocess.run(
        [
            *AGENT,
            "log",
            "--file",
            job["log"],
            "--offset",
            "4",
            "--limit",
            "2",
        ],
        env=node["env"],
        capture_output=True,
        check=True,
    )
    assert part.stdout == b"tw"


def test_a_follower_stops_when_its_channel_closes(node: dict[str, Any]) -> None:
    job = launch_sh(node, "j9", "echo started; sleep 30")
    closed = subprocess.run(
        [
            *AGENT,
            "log",
            "--file",
            job["log"],
            "--follow",
            "--job-dir",
            job["job_dir"],
            "--pid",
            str(job["pid"]),
        ],
        env=node["env"],
        capture_output=True,
        timeout=scaled(30),
        input=b"",
    )
    still = agent(node["env"], "status", "--job-dir", job["job_dir"], "--pid", str(job["pid"]))
    agent(node["env"], "kill", "--pgid", str(job["pgid"]), "--grace", "1")
    assert closed.returncode == 0 and still["running"]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: PID 1 here leaves exited children unreaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def test_a_follower_whose_parent_goes_stops_though_its_stdin_stays_open(
    node: dict[str, Any],
) -> None:
    job = launch_sh(node, "j10", "echo started; sleep 60")
    argv = [*AGENT, "log", "--file", job["log"], "--follow", "--job-dir", job["job_dir"]]
    argv += ["--pid", str(job["pid"])]
    read_end, write_end = os.pipe()  # the follower's stdin: this test holds it open
    try:
        # sh starts the follower on the pipe and is killed: the session that ran it is gone
        with subprocess.Popen(
            ["sh", "-c", 'exec 3<&0; "$@" <&3 & echo $!; exec sleep 60', "sh", *argv],
            env=node["env"],
            stdin=read_end,
            stdout=subprocess.PIPE,
        ) as parent:
            assert parent.stdout is not None
            follower = int(parent.stdout.readline())
            assert parent.stdout.readline() == b"started\n"  # the follower is following
            parent.kill()
        wait_for(lambda: not _alive(follower), timeout_s=30, what="the orphaned follower to end")
    finally:
        os.close(read_end)
        os.close(write_end)
        agent(node["env"], "kill", "--pgid", str(job["pgid"]), "--grace", "1")


def test_errors_come_back_as_json(node: dict[str, Any]) -> None:
    answer = agent(
        node["env"],
        "launch",
        "--job-dir",
        str(node["dir"] / "j8"),
        "--cwd",
        "/no/such/dir",
        "--",
        "true",
        check=False,
    )
    assert answer == {"error": "working directory /no/such/dir does not exist on this node"}
    assert agent(node["env"], "kill", "--pgid", "1", check=False) == {
        "error": "refusing to signal process group 1"
    }


def _tar(*members: tuple[str, bytes | None, int]) -> bytes:
    """A tar of (name, content or None for a directory, mode) members; '->x' content: a link."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif content.startswith(b"->"):
                info.type, info.linkname = tarfile.SYMTYPE, content[2:].decode()
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def stage(env: dict[str, str], job_dir: Path, data: bytes) -> Any:
    done = subprocess.run(
        [*AGENT, "stage", "--job-dir", str(job_dir)], env=env, input=data, capture_output=True
    )
    return done.returncode, json.loads(done.stdout)


def test_staged_files_land_privately_keeping_their_owners_bits(node: dict[str, Any]) -> None:
    job_dir = node["dir"] / "jobs" / "s1"
    code, answer = stage(
        node["env"],
        job_dir,
        _tar(("run.sh", b"echo hi\n", 0o755), ("data", None, 0o755), ("data/x.csv", b"1\n", 0o644)),
    )
    assert code == 0 and answer == {
        "job_dir": str(job_dir),
        "files": ["run.sh", "data/x.csv"],
    }
    modes = {
        p: stat.S_IMODE(os.stat(job_dir / p).st_mode) for p in ("", "run.sh", "data", "data/x.csv")
    }
    assert modes == {"": 0o700, "run.sh": 0o700, "data": 0o700, "data/x.csv": 0o600}
    assert stat.S_IMODE(os.stat(job_dir.parent).st_mode) == 0o700  # created parents too
    # staging again (a repeated launch) replaces what is there
    assert stage(node["env"], job_dir, _tar(("run.sh", b"echo again\n", 0o500)))[0] == 0
    assert (job_dir / "run.sh").read_bytes() == b"echo again\n"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../escape", b"x", 0o644), "not a relative path inside the job dir"),
        (("/etc/evil", b"x", 0o644), "not a relative path inside the job dir"),
        (("link", b"->/etc/shadow", 0o777), "only files and directories are staged"),
    ],
)
def test_staging_refuses_what_would_leave_the_job_dir(
    node: dict[str, Any], member: tuple[str, bytes, int], why: str
) -> None:
    code, answer = stage(node["env"], node["dir"] / "s2", _tar(member))
    assert code == 1 and why in answer["error"]
    assert not (node["dir"] / "escape").exists()


def test_setenv_reaches_the_agent_and_the_job(node: dict[str, Any]) -> None:
    job = agent(
        node["env"],
        "--setenv",
        "FROM_NODE_ENV=yes",
        "launch",
        "--job-dir",
        str(node["dir"] / "j9"),
        "--",
        "sh",
        "-c",
        'echo "$FROM_NODE_ENV"; umask',
    )
    wait_ended(node["env"], job)
    ours = os.umask(0o022)
    os.umask(ours)
    # the job has the umask the agent started with; the agent's own files are private
    assert Path(job["log"]).read_text() == f"yes\n{ours:04o}\n"
    assert stat.S_IMODE(os.stat(job["log"]).st_mode) == 0o600


def test_a_serving_agent_answers_in_order_and_survives_a_bad_request(
    node: dict[str, Any],
) -> None:
    requests = [
        {
            "args": ["launch", "--job-dir", str(node["dir"] / "s1"), "--spec", "-"],
            "input": json.dumps({"argv": ["sh", "-c", "echo served"]}),
        },  # fmt: skip
        {"args": ["launch", "--no-such-flag"]},
        {"args": ["probe"]},
        "not json",
        {"args": ["remove", "--path", str(node["dir"] / "absent")]},
    ]
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    done = subprocess.run(
        [*AGENT, "serve"],
        env=node["env"],
        input=lines.encode(),
        capture_output=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    launched, flag, probe, garbled, removed = [json.loads(x) for x in done.stdout.splitlines()]
    assert launched["exit"] == 0 and launched["answer"]["pid"] > 0
    assert flag["exit"] == 1 and "malformed request" in flag["answer"]["error"]
    assert probe == {"exit": 1, "answer": {"error": "a serving agent answers only launch, "
                                                    "status, remove"}}  # fmt: skip
    assert garbled["exit"] == 1
    assert removed == {"exit": 0, "answer": {"removed": False}}
    log = Path(launched["answer"]["log"])
    wait_for(lambda: log.read_text() == "served\n", what="the served launch's output")


def test_a_job_command_is_found_on_the_path_its_own_env_sets(node: dict[str, Any]) -> None:
    bin_dir = node["dir"] / "bin"
    bin_dir.mkdir()
    (bin_dir / "only-here").write_text("#!/bin/sh\necho found on the PATH of the job\n")
    (bin_dir / "only-here").chmod(0o755)
    job = agent(
        node["env"], "launch", "--job-dir", str(node["dir"] / "p1"),
        "--env", f"PATH={bin_dir}:/usr/bin:/bin", "--", "only-here",
    )  # fmt: skip
    ended = wait_ended(node["env"], job)
    assert Path(job["log"]).read_text() == "found on the PATH of the job\n"
    assert ended["exit_code"] == 0
