"""Two services on one PostgreSQL store sharing one simulated cluster, and a leader to kill.

Used by ``tests/test_failover.py`` (CI-sized) and ``bench/failover.py`` (the full run). The
nodes run in a process of their own (``jupyter_gpusched.cluster.sim.serve``), as real nodes
would outlive any scheduler; each job writes a line when it starts and when it ends, so a
second run or an overlap on a GPU shows in what the nodes saw, not in what the store says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _fixtures_polling import Deadline, scaled
from _fixtures_service import ServiceProcess

#: The job body: one line in ``DIR/<job id>.runs`` at start and at end.
JOB_CODE = """\
import json, os, sys, time
path = os.path.join({dir!r}, os.environ["GPUSCHED_JOB_ID"] + ".runs")
rec = {{"node": os.environ.get("GPUSCHED_SIM_NODE"), "gpus": os.environ.get(
    "CUDA_VISIBLE_DEVICES", ""), "pid": os.getpid()}}
with open(path, "a") as f:
    f.write(json.dumps({{**rec, "at": time.time(), "what": "start"}}) + "\\n")
time.sleep(float(sys.argv[1]))
with open(path, "a") as f:
    f.write(json.dumps({{**rec, "at": time.time(), "what": "end"}}) + "\\n")
"""


class SimNodes:
    """The simulated cluster in its own process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        with open(folder.parent / "sim-nodes.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_gpusched.cluster.sim.serve", str(folder)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = Deadline(60)
        while not (folder / "nodes.json").exists():
            if self.proc.poll() is not None or deadline.expired():
                raise RuntimeError("the simulated nodes did not start")
            time.sleep(0.1)
        self.nodes: list[dict[str, Any]] = json.loads((folder / "nodes.json").read_text())

    def stop(self) -> None:
        """Stop the nodes' SSH servers (jobs are killed by the caller's cleanup)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(scaled(30))


@dataclass
class Pair:
    """Two services on one store; which one leads changes as they are killed."""

    services: list[ServiceProcess]
    kills: list[float] = field(default_factory=list)  # wall time of each kill -9

    def leader(self, timeout_s: float = 30.0) -> ServiceProcess:
        """The service whose log says it leads now (the latest to say so)."""
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            best: tuple[float, ServiceProcess] | None = None
            for s in self.services:
                if s.proc is None:
                    continue
                for at in led_at(s.log_text()):
                    if best is None or at > best[0]:
                        best = (at, s)
            if best is not None and best[1].proc is not None:
                return best[1]
            time.sleep(0.2)
        raise AssertionError("no service leads")

    def wait_standby(self, timeout_s: float = 120.0) -> None:
        """Until every service runs (a restarted one has said it stands by or leads)."""
        deadline = Deadline(timeout_s)
        for s in self.services:
            while "scheduler started" not in s.log_text(this_run=True):
                assert not deadline.expired(), "a restarted service did not come up"
                time.sleep(0.2)

    def kill_leader(self) -> tuple[ServiceProcess, float]:
        """kill -9 the leader and start it again as a standby; the time until one leads."""
        self.wait_standby()
        victim = self.leader()
        before = {id(s): len(led_at(s.log_text())) for s in self.services}
        killed_at = time.time()
        victim.stop(sig=signal.SIGKILL)
        self.kills.append(killed_at)
        victim.start(wait=False)
        deadline = Deadline(60)
        while not deadline.expired():
            for s in self.services:
                stamps = led_at(s.log_text())
                if len(stamps) > before[id(s)]:
                    return victim, max(0.0, stamps[-1] - killed_at)
            time.sleep(0.1)
        raise AssertionError(f"no service took over within {deadline}")

    def freeze_leader(self) -> float:
        """SIGSTOP the leader until a standby leads, then SIGCONT it; the time to take over.

        A hung leader's process is alive, so only its lease's expiry lets another take over;
        when it wakes up its writes must be refused (fencing) and it must stand by.
        """
        self.wait_standby()
        victim = self.leader()
        assert victim.proc is not None
        before = {id(s): len(led_at(s.log_text())) for s in self.services}
        frozen_at = time.time()
        victim.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = Deadline(60)
            while not deadline.expired():
                for s in self.services:
                    stamps = led_at(s.log_text())
                    if s is not victim and len(stamps) > before[id(s)]:
                        return max(0.0, stamps[-1] - frozen_at)
                time.sleep(0.1)
            raise AssertionError(f"no standby took over from a frozen leader within {deadline}")
        finally:
            victim.proc.send_signal(signal.SIGCONT)


def led_at(log: str) -> list[float]:
    """Wall times at which a service's log says it started to lead."""
    out = []
    stamp = r"\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) "
    for m in re.finditer(stamp + ".*this scheduler leads the queue", log):
        out.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return out


def start_pair(root: Path, store_url: str, nodes: list[dict[str, Any]]) -> Pair:
    """Two services on ``store_url`` and ``nodes``; the first one started leads."""
    common: dict[str, Any] = {
        "store_url": store_url,
        "nodes": nodes,
        "leader_ttl_s": 3.0,
        "tick_interval_s": 0.1,
        "poll_interval_s": 0.2,
        "inventory_interval_s": 10.0,
    }
    first = ServiceProcess(root / "a", **common).start()
    second = ServiceProcess(root / "b", **common)
    second.admin_token = first.admin_token  # one store: one token works on both
    second.start()
    return Pair([first, second])


@dataclass
class Audit:
    """What the nodes saw: runs per job and GPU intervals."""

    starts: dict[int, int]
    overlaps: list[str]


def audit(folder: Path) -> Audit:
    """Read every job's start/end lines; find jobs that ran twice and GPUs used twice at once."""
    starts: dict[int, int] = defaultdict(int)
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for path in folder.glob("*.runs"):
        job_id = int(path.stem)
        opened: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["what"] == "start":
                starts[job_id] += 1
                opened[rec["pid"]] = rec
            elif rec["pid"] in opened:
                begin = opened.pop(rec["pid"])
                for gpu in filter(None, rec["gpus"].split(",")):
                    spans[gpu].append((begin["at"], rec["at"], job_id))
    overlaps = []
    for gpu, items in spans.items():
        items.sort()
        for (_, end, a), (start, _, b) in zip(items, items[1:], strict=False):
            if start < end - 0.05:  # a job's end and the next one's start may touch
                overlaps.append(f"{gpu}: jobs {a} and {b}")
    return Audit(dict(starts), overlaps)


def job_spec(folder: Path, seconds: float, gpus: int) -> dict[str, Any]:
    """A batch job that records its run in ``folder``."""
    code = JOB_CODE.format(dir=str(folder))
    return {"kind": "script", "command": [sys.executable, "-c", code, str(seconds)], "gpus": gpus}


def kill_leftovers(folder: Path) -> None:
    """Kill jobs still running from ``folder``'s runs (a failed test must not leave them).

    Only a pid whose command line still names ``folder`` (the job's code does): pids are
    reused (pid_max is 32768 here and a test run starts thousands of processes), and the pid
    of a job that ended long ago may be another test's server by now.
    """
    pids: set[int] = set()
    for path in folder.glob("*.runs"):
        for line in path.read_text().splitlines():
            pids.add(json.loads(line)["pid"])
    mark = str(folder).encode()
    for pid in sorted(pids):
        try:
            if mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
