"""An agent killed in the middle of a launch never leaves a job running without its record.

A scheduler that dies while its node is launching a job (its SSH channel closes, and the
command's process group is signalled) must find, on its next try, either the first launch's
record or nothing started at all -- never a job it cannot know about, which a relaunch would
then run a second time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpusched.node import agent, jobs

AGENT = [sys.executable, "-m", "jupyter_gpusched.node.agent"]


def launch_cut_short(job_dir: Path, marker: Path, after_s: float) -> None:
    """Start a launch in a process group of its own and SIGKILL the group after ``after_s``."""
    code = f"open({str(marker)!r}, 'a').write('run\\n'); import time; time.sleep(30)"
    proc = subprocess.Popen(
        [*AGENT, "launch", "--job-dir", str(job_dir), "--", sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def jobs_writing(path: Path) -> list[int]:
    """Live (not zombie) ``python -c CODE`` processes whose code names ``path`` (quoted, as
    the job's code does: ``runs1`` must not match ``runs12``). The launch's wrapper, a fork of
    the agent, carries the code too, on the agent's command line (``-m ... launch``)."""
    quoted = repr(str(path)).encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[1:2] == [b"-c"] and quoted in argv[2] and state != "Z":
            found.append(int(entry))
    return found


def kill_job(job_dir: Path) -> None:
    """SIGKILL the job of ``job_dir``'s launch while its wrapper runs (its pgid is not
    someone else's by now: pids are reused)."""
    record = job_dir / "launch.json"
    if record.exists():
        launched = json.loads(record.read_text())
        if jobs.is_running(launched["pid"], launched["start_time"]):
            os.killpg(launched["pgid"], signal.SIGKILL)


def full_launch_s(tmp_path: Path) -> float:
    """How long one launch takes here, from starting the agent to its answer."""
    began = time.monotonic()
    subprocess.run([*AGENT, "launch", "--job-dir", str(tmp_path / "timing"), "--", "true"],
                   check=True, capture_output=True)  # fmt: skip
    return time.monotonic() - began


@pytest.mark.slow
def test_a_launch_killed_at_any_moment_is_found_again_or_never_ran(tmp_path: Path) -> None:
    whole_s = full_launch_s(tmp_path)
    for step in range(24):  # kill moments spread over the whole launch
        job_dir, marker = tmp_path / f"job{step}", tmp_path / f"runs{step}"
        launch_cut_short(job_dir, marker, whole_s * step / 24)
        try:
            relaunch = agent.launch(
                str(job_dir), [sys.executable, "-c", "import time; time.sleep(30)"]
            )
            # reused: the first launch ran it and its record says where; else nothing of the
            # first launch runs and the second started it. Counted by process: the job is
            # spawned before its record is written, so it runs by now even if, on a busy
            # machine, it has not yet written its line.
            runs = len(jobs_writing(marker))
            assert runs == (1 if relaunch["reused"] else 0), (step, relaunch)
        finally:
            kill_job(job_dir)


def test_a_repeated_launch_returns_the_first_and_starts_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    try:
        first = agent.launch(str(job_dir), argv)
        again = agent.launch(str(job_dir), argv)
        assert not first["reused"] and again["reused"]
        assert {k: again[k] for k in ("pid", "pgid", "start_time")} == {
            k: first[k] for k in ("pid", "pgid", "start_time")
        }
    finally:
        kill_job(job_dir)


def test_a_claimed_job_dir_never_starts_and_a_launched_one_is_reported(tmp_path: Path) -> None:
    assert agent.claim(str(tmp_path / "a")) == {"started": False}
    with pytest.raises(agent.AgentError, match="never finished starting"):
        agent.launch(str(tmp_path / "a"), ["true"])
    try:
        launched = agent.launch(str(tmp_path / "b"), ["sleep", "30"])
        claimed = agent.claim(str(tmp_path / "b"))
        assert claimed["started"] is True and claimed["pid"] == launched["pid"]
    finally:
        kill_job(tmp_path / "b")


def test_the_wrapper_records_the_end_even_when_its_agent_died_before_reading(
    tmp_path: Path,
) -> None:
    """A scheduler killed mid-launch takes the agent with it; the job's end is still written."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the agent is gone: writing the report fails
    pid = os.fork()
    if pid == 0:
        argv, env = ["sh", "-c", "exit 4"], dict(os.environ)
        os._exit(jobs._wrap(str(job_dir), argv, env, write_fd, "log", 0o022))
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (job_dir / "exit_code").read_text() == "4"
    assert json.loads((job_dir / "launch.json").read_text())["pgid"] > 0
