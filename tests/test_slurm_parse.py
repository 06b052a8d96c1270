"""What Slurm prints, read right: nodes, GRES, job rows, exit codes; the sbatch line we build."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jupyter_gpusched.cluster.slurm import commands, parse
from jupyter_gpusched.core.models import Job, JobSpec

NODE_LINE = (
    "NodeName=gpu1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=8 CPUTot=8 CPULoad=4.70 "
    "AvailableFeatures=fake,test ActiveFeatures=fake,test Gres=gpu:fake:4 GresDrain=N/A "
    "GresUsed=gpu:fake:2(IDX:0-1) NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 "
    "OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=16000 AllocMem=100 State=MIXED "
    "Partitions=gpu CfgTRES=cpu=8,mem=16000M,billing=8 AllocTRES=cpu=1,mem=100M "
    "Reason=Low socket*core*thread count, Low CPUs [root@2026-11-23T08:35:42]"
)


def test_a_node_line_gives_its_gpus_in_index_order_and_which_are_allocated() -> None:
    (node,) = parse.parse_nodes(NODE_LINE + "\n")
    assert node.name == "gpu1" and node.addr == "127.0.0.1"
    assert (node.cpus, node.mem_mb) == (8.0, 16000.0)
    assert node.gpu_types == ("fake",) * 4
    assert node.gpus_used == (0, 1)
    assert node.features == ("fake", "test") and node.partitions == ("gpu",)
    assert node.reason.startswith("Low socket*core*thread count, Low CPUs")
    assert node.schedulable and not node.gone


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:fake:4", [("gpu", "fake", 4, ())]),
        ("gpu:4", [("gpu", "", 4, ())]),
        ("gpu:a100:2(S:0-1),gpu:v100:2(S:1)", [("gpu", "a100", 2, ()), ("gpu", "v100", 2, ())]),
        ("gpu:a100:2(IDX:0,2),gpu:v100:0(IDX:N/A)", [("gpu", "a100", 2, (0, 2)),
                                                    ("gpu", "v100", 0, ())]),
        ("gpu:fake:3(IDX:0-1,3),shard:8", [("gpu", "fake", 3, (0, 1, 3)), ("shard", "", 8, ())]),
        ("(null)", []),
        ("", []),
    ],
)  # fmt: skip
def test_gres_strings_split_into_name_type_count_and_indices(
    text: str, expected: list[tuple[str, str, int, tuple[int, ...]]]
) -> None:
    assert [(g.name, g.type, g.count, g.indices) for g in parse.gres_list(text)] == expected


@pytest.mark.parametrize(
    ("state", "schedulable", "gone"),
    [
        ("IDLE", True, False),
        ("MIXED", True, False),
        ("ALLOCATED", True, False),
        ("IDLE+DRAIN", False, False),
        ("MIXED+DRAIN", False, False),
        ("DOWN*", False, True),
        ("IDLE*", False, True),
        ("DOWN+NOT_RESPONDING", False, True),
        ("UNKNOWN+DRAIN+INVALID_REG", False, True),
    ],
)
def test_node_states_say_whether_new_jobs_go_there_and_whether_running_ones_are_gone(
    state: str, schedulable: bool, gone: bool
) -> None:
    (node,) = parse.parse_nodes(NODE_LINE.replace("State=MIXED", f"State={state}"))
    assert (node.schedulable, node.gone) == (schedulable, gone)


@pytest.mark.parametrize(
    ("wait_status", "code"), [(0, 0), (768, 3), (15, -15), (9, -9), (143 << 8, 143), (None, None)]
)
def test_wait_statuses_become_exit_codes_with_signals_negative(
    wait_status: int | None, code: int | None
) -> None:
    assert parse.exit_code(wait_status) == code


def test_squeue_rows_keep_names_and_reasons_whole() -> None:
    text = (
        "7|gpusched-12.0-20261123T090000|RUNNING|None|0|gpu1|2026-11-23T09:05:00|\n"
        "8|gpusched-13.1-20261123T090000|PENDING|ReqNodeNotAvail, UnavailableNodes:gpu1|0||"
        "NONE|\n"
        "9|x|FAILED|NonZeroExitCode|768|gpu1|2026-11-23T09:00:02|\n"
    )
    rows = parse.parse_squeue(text)
    assert rows[7].active and rows[7].started and rows[7].node == "gpu1"
    assert rows[8].active and not rows[8].started
    assert rows[8].reason == "ReqNodeNotAvail, UnavailableNodes:gpu1"
    assert not rows[9].active and parse.exit_code(rows[9].exit_status) == 3
    assert rows[9].ended_at == datetime(2026, 11, 23, 9, 0, 2).astimezone(UTC)


def test_squeue_json_gives_the_gpu_indices_each_job_holds() -> None:
    doc = (
        '{"jobs": [{"job_id": 2, "name": "a", "job_state": "RUNNING", "exit_code": 0,'
        ' "nodes": "gpu1", "end_time": 1795423277, "gres_detail": ["gpu:fake:2(IDX:1,3)"]},'
        ' {"job_id": 3, "name": "b", "job_state": "PENDING", "gres_detail": []}]}'
    )
    rows = parse.parse_squeue_json(doc)
    assert rows[2].gpus == (1, 3) and rows[3].gpus == ()
    assert parse.parse_squeue_json("not json") == {}


def test_sacct_rows_carry_exit_code_and_signal() -> None:
    rows = parse.parse_sacct("12|n|FAILED|3:0|2026-11-23T09:00:02\n13|m|CANCELLED by 0|0:15|\n")
    assert parse.exit_code(rows[12].exit_status) == 3
    assert (rows[13].state, parse.exit_code(rows[13].exit_status)) == ("CANCELLED", -15)


def test_sbatch_line_carries_the_packers_node_and_the_jobs_limits_and_no_shell() -> None:
    submission = commands.Submission(
        name="gpusched-5.0-20261123T090000",
        node="gpu1",
        gpus=2,
        gres_type="a100",
        cpus=1.5,
        mem_gb=0.5,
        limit_s=3600,
        workdir="/home/alice/.gpusched/slurm/jobs/x",
        log="/home/alice/.gpusched/slurm/jobs/x/output.log",
        script="/srv/gpusched/gpusched-batch.sh",
        launch_file="/home/alice/.gpusched/slurm/jobs/x/launch.sh",
        partition="gpu",
        extra=["--account=lab"],
    )
    argv = submission.argv()
    assert argv[:2] == ["sbatch", "--parsable"]
    for option in ("--job-name=gpusched-5.0-20261123T090000", "--nodelist=gpu1",
                   "--gres=gpu:a100:2", "--cpus-per-task=2", "--mem=512M", "--time=60",
                   "--no-requeue", "--partition=gpu", "--account=lab"):  # fmt: skip
        assert option in argv
    # the job's argv and env stay off the line, in the launch file of its private job dir
    tail = argv[argv.index("/srv/gpusched/gpusched-batch.sh") + 1 :]
    assert tail == ["/home/alice/.gpusched/slurm/jobs/x/launch.sh"]
    assert commands.as_user("alice", ["scancel", "7"]) == [
        "sudo", "-n", "-u", "alice", "--", "scancel", "7"
    ]  # fmt: skip


def test_the_launch_file_gives_the_batch_script_the_jobs_argv_and_env_verbatim(
    tmp_path: Path,
) -> None:
    hostile = ["printf", "%s|", "a b; rm -rf ~ $(id)", "x,y=z", "it's", "line\nbreak", ""]
    env = {"LR": "0.1,0.2", "SECRET": "$(id) `id` 'q' \"dq\"\n", "EMPTY": ""}
    launch = tmp_path / "launch.sh"
    launch.write_text(commands.launch_file_text(hostile, env))
    script = tmp_path / "run.sh"
    script.write_text('. "$1" || exit 126\n"$@"\nprintf "%s|" "$LR" "$SECRET" "$EMPTY"\n')
    done = subprocess.run(["sh", str(script), str(launch)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "|".join([*hostile[2:], *env.values()]) + "|"
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        commands.launch_file_text(["true"], {"1X": "y"})


def test_a_job_without_gpus_or_limit_asks_slurm_for_neither() -> None:
    argv = commands.Submission(
        "n", "gpu1", 0, "", 1, 1, None, "/w", "/w/log", "/s.sh", "/w/launch.sh"
    ).argv()
    assert not [a for a in argv if a.startswith(("--gres", "--time", "--partition"))]


def test_job_names_are_unique_per_job_attempt_and_submission_time() -> None:
    job = Job(
        id=12,
        attempt=2,
        spec=JobSpec(kind="script", command=["true"]),
        submitted_at=datetime(2026, 11, 23, 9, 0, 5, tzinfo=UTC),
    )
    assert commands.job_name(job) == "gpusched-12.2-20261123T090005"
