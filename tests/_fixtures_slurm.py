"""A real Slurm cluster on loopback: Debian's munged, slurmctld and slurmd with fake GPU GRES.

One controller and one node (``gpu1``, 4 GPUs of GRES type ``fake`` backed by ``mknod`` device
nodes, 8 CPUs, 16 GB), every file under one world-traversable temp dir (the owner tests run
jobs as alice), ports picked free. Slurm jobs get real ``CUDA_VISIBLE_DEVICES``; only the GPUs
are fake. Needs root (slurmd runs jobs as their users) and the packages
``scripts/system-deps.sh`` installs; without them the fixtures skip and say why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fixtures_polling import Deadline, scaled

NODE = "gpu1"
GPUS = 4
BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")


def slurm_missing_reason() -> str | None:
    """Why a Slurm cluster cannot start here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root: slurmd runs jobs as their users"
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if missing:
        return f"needs Debian's slurmctld, slurmd, slurm-client and munge ({missing} missing)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """munged + slurmctld + slurmd under ``base``; :meth:`start`, :meth:`stop`."""

    def __init__(self, base: Path, *, gpus: int = GPUS, cpus: int = 8, mem_mb: int = 16000):
        self.base = base
        self.gpus = gpus
        self.conf = base / "slurm.conf"
        self.munge_socket = base / "munge" / "munge.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen[bytes]] = []
        for sub in ("munge", "munge-key", "state", "spool", "log", "dev", "work"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "munge").chmod(0o755)  # jobs' users reach the socket
        (base / "munge-key").chmod(0o700)
        (base / "work").chmod(0o1777)
        key = base / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(gpus):
            os.mknod(base / "dev" / f"fakegpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        self._write_config(cpus, mem_mb)

    def _write_config(self, cpus: int, mem_mb: int) -> None:
        b = self.base
        lines = {
            "ClusterName": "gpusched",
            "SlurmctldHost": "localhost(127.0.0.1)",
            "SlurmctldPort": _free_port(),
            "SlurmdPort": _free_port(),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "CredType": "cred/munge",
            "StateSaveLocation": b / "state",
            "SlurmdSpoolDir": b / "spool",
            "SlurmctldPidFile": b / "slurmctld.pid",
            "SlurmdPidFile": b / "slurmd.pid",
            "SlurmctldLogFile": b / "log" / "slurmctld.log",
            "SlurmdLogFile": b / "log" / "slurmd.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core_Memory",
            "GresTypes": "gpu",
            "DefMemPerCPU": 100,
            "SlurmdParameters": "config_overrides",  # trust the node line, not this VM
            "ReturnToService": 2,
            "SchedulerType": "sched/backfill",
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": b / "log" / "jobcomp.txt",
            "KillWait": 2,
            "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=100000",
            "SlurmdTimeout": 30,
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (
            f"NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
            f"CPUs={cpus} RealMemory={mem_mb} Gres=gpu:fake:{self.gpus} Feature=fake "
            "State=UNKNOWN\n"
            f"PartitionName=gpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n"
        )
        self.conf.write_text(text)
        last = f"[0-{self.gpus - 1}]" if self.gpus > 1 else "0"
        (b / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={NODE} Name=gpu Type=fake File={b}/dev/fakegpu{last}\n"
        )

    def _spawn(self, argv: list[str], log: str) -> None:
        with open(self.base / "log" / log, "ab") as out:
            self._procs.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
            )

    def start(self, timeout_s: float = 60.0) -> SlurmCluster:
        """Start the daemons and wait until the node is idle."""
        b = self.base
        key, log = b / "munge-key", b / "log"
        self._spawn(
            ["/usr/sbin/munged", "-F", "-f", f"--socket={self.munge_socket}",
             f"--key-file={key / 'munge.key'}", f"--log-file={log / 'munged.log'}",
             f"--pid-file={b / 'munge' / 'munged.pid'}", f"--seed-file={key / 'seed'}"],
            "munged.out",
        )  # fmt: skip
        self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged")
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._spawn(["/usr/sbin/slurmd", "-D", "-N", NODE, "-f", str(self.conf)], "slurmd.out")
        self._wait(lambda: self.node_state() in ("idle", "mixed"), timeout_s, "the node")
        return self

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            if any(p.poll() is not None for p in self._procs):
                break
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.1)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((self.base / "log").iterdir())
        )
        self.stop()
        raise RuntimeError(f"{what} did not come up within {deadline}:\n{logs}")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            list(argv),
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=scaled(60),
        )

    def node_state(self) -> str:
        """``sinfo``'s state of the node (idle, mixed, allocated, down, ...)."""
        out = self.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False)
        return out.stdout.strip()

    def sbatch(self, *args: str) -> int:
        """Submit a job as root behind the scheduler's back; its Slurm job id."""
        return int(self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0])

    def job_state(self, slurm_id: int) -> str:
        """A job's Slurm state (RUNNING, COMPLETED, ...; '' once forgotten)."""
        out = self.run("squeue", "-h", "-t", "all", "-j", str(slurm_id), "-o", "%T", check=False)
        return out.stdout.strip()

    def wait_job(self, slurm_id: int, states: set[str], timeout_s: float = 30.0) -> str:
        """Wait until the job is in one of ``states``; the state reached."""
        deadline = Deadline(timeout_s)
        state = ""
        while not deadline.expired():
            state = self.job_state(slurm_id)
            if state in states:
                return state
            time.sleep(0.1)
        raise AssertionError(f"Slurm job {slurm_id} still {state!r} after {deadline}")

    def cancel_all(self, timeout_s: float = 15.0) -> None:
        """Kill every job and wait until none runs (tests leave the cluster empty)."""
        ids = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if ids:
            self.run("scancel", "--signal=KILL", "--full", *ids, check=False)
            self.run("scancel", *ids, check=False)
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (the reverse of their start)."""
        if any(p.poll() is None for p in self._procs):
            self.cancel_all()
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(scaled(15))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs = []


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One Slurm cluster for the session; each test leaves it without jobs."""
    reason = slurm_missing_reason()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="gpusched-slurm-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
