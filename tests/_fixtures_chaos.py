"""Chaos: one service killed with kill -9 at random moments, inside launches too, while jobs run.

Used by ``tests/test_chaos.py`` (CI-sized) and ``bench/chaos.py`` (200 jobs, both stores, day
and night windows). The nodes run in a process of their own (they outlive the service, as
real nodes would); every job writes a line when it starts and when it ends
(:data:`_fixtures_failover.JOB_CODE`), so a second run or two jobs on one GPU show in what the
nodes saw, not in what the store says. Jobs have ``retries=2``: a job wrongly taken for lost
would run again and be counted.

Half of the kills are aimed at the launch window: the service is killed the moment the store
shows a job ``starting`` (written as placed, its launch not yet recorded as done).

With ``retrying``, a client submits that many more jobs one after another *while* the kills
land (:func:`_fixtures_retrying.retrying_submits`): a create cut after its commit is retried
with its ``Idempotency-Key``, and every job beyond one per create is a duplicate.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _fixtures_failover import audit, job_spec
from _fixtures_retrying import RetryingReport, retrying_submits
from _fixtures_service import ServiceProcess
from sqlalchemy import create_engine, text

ENDED = ("succeeded", "failed", "cancelled", "lost")
#: Policy windows in force all the time: the lab's day rules (batch jobs limited in runtime,
#: a share kept for interactive work) or its night rules.
WINDOWS: dict[str, dict[str, Any]] = {
    "day": {
        "name": "day",
        "interactive_reserved_share": 0.25,
        "interactive_max_share": 0.75,
        "batch_max_runtime_s": "1h",
        "preempt_batch": True,
    },
    "night": {"name": "night", "interactive_max_share": 0.5},
}


@dataclass
class ChaosReport:
    """What one run saw."""

    store: str
    window: str
    jobs: int
    kills: int = 0
    kills_in_launch: int = 0  # kills that landed while a job was starting
    not_succeeded: dict[int, str] = field(default_factory=dict)  # job -> final state, reason
    lost: list[int] = field(default_factory=list)  # ended lost, or never ran
    run_twice: list[int] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)  # a GPU used by two jobs at once
    gpus_held: list[str] = field(default_factory=list)  # held at the end, with nothing running
    restart_to_answer_s: list[float] = field(default_factory=list)
    scheduler_start_s: list[float] = field(default_factory=list)  # of which: server up -> ready
    elapsed_s: float = 0.0
    details: dict[int, list[str]] = field(default_factory=dict)  # what went wrong, per job
    retrying: RetryingReport | None = None  # the retrying client's creates, if one ran

    @property
    def clean(self) -> bool:
        """Nothing lost, repeated, overlapping, wrongly ended or left holding GPUs."""
        retried = self.retrying is None or (self.retrying.clean and not self.retrying.failed)
        return retried and not (
            self.not_succeeded or self.lost or self.run_twice or self.overlaps or self.gpus_held
        )

    def line(self) -> str:
        """One line for the bench's table."""
        waits = sorted(self.restart_to_answer_s) or [0.0]
        starts = sorted(self.scheduler_start_s) or [0.0]
        return (
            f"| {self.store} | {self.window} | {self.jobs} | {self.kills} "
            f"({self.kills_in_launch} in a launch) | {len(self.lost)} | {len(self.run_twice)} | "
            f"{len(self.not_succeeded)} | {len(self.gpus_held)} | {len(self.overlaps)} | "
            f"{waits[len(waits) // 2]:.1f} / {waits[-1]:.1f} s | "
            f"{starts[len(starts) // 2]:.1f} / {starts[-1]:.1f} s | {self.retried()} | "
            f"{self.elapsed_s:.0f} s |"
        )

    def retried(self) -> str:
        """The retrying client's column: creates answered of asked, duplicates, missing."""
        r = self.retrying
        if r is None:
            return "-"
        return f"{r.submitted}/{r.jobs}, {r.duplicates} duplicates, {len(r.missing)} missing"


def _stamp(log: str, marker: str) -> float | None:
    """Wall time of the first log line holding ``marker``."""
    m = re.search(r"\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) [^\n]*" + re.escape(marker), log)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() if m else None


def _scheduler_start_s(service: ServiceProcess) -> float:
    """From the server listening to its scheduler started, in the current run's log."""
    log = service.log_text(this_run=True)
    up, ready = _stamp(log, "is running at"), _stamp(log, "scheduler started")
    return ready - up if up is not None and ready is not None else float("nan")


def job_story(engine: Any, runs: Path, job_id: int) -> list[str]:
    """A job's audit log from the store and its runs as the nodes saw them."""
    query = text(
        "SELECT at, kind, from_state, to_state, detail FROM events WHERE job_id = :j ORDER BY id"
    )
    with engine.connect() as conn:
        lines = [" ".join(str(x) for x in row) for row in conn.execute(query, {"j": job_id})]
    path = runs / f"{job_id}.runs"
    return lines + (path.read_text().splitlines() if path.exists() else [])


def wait_ended(service: ServiceProcess, ids: list[int], timeout_s: float) -> dict[int, Any]:
    """Every job as the API shows it, once all of ``ids`` ended (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = service.api("GET", "jobs?limit=1000", token=service.admin_token)["jobs"]
        found = {j["id"]: j for j in listed}
        if all(found[i]["state"] in ENDED for i in ids):
            return found
        if time.monotonic() > deadline:
            stuck = {i: found[i]["state"] for i in ids if found[i]["state"] not in ENDED}
            raise AssertionError(f"jobs did not end within {timeout_s:.0f} s: {stuck}")
        time.sleep(0.5)


def outcomes(
    found: dict[int, Any], ids: list[int], runs: Path
) -> tuple[dict[int, str], list[int], list[int], list[str]]:
    """What became of ``ids`` (as the API shows them, ``found``) and what the nodes saw.

    Jobs not succeeded (with why), lost (ended lost, or never started), run twice, and GPU
    overlaps.
    """
    seen = audit(runs)
    not_succeeded = {
        i: f"{found[i]['state']}: {found[i].get('reason')}"
        for i in ids
        if found[i]["state"] != "succeeded"
    }
    lost = [i for i in ids if found[i]["state"] == "lost" or i not in seen.starts]
    run_twice = sorted(i for i, n in seen.starts.items() if n > 1)
    return not_succeeded, lost, run_twice, seen.overlaps


def _starting(engine: Any) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT 1 FROM jobs WHERE state = 'starting'")).first())


def run_chaos(
    root: Path,
    *,
    store_url: str,
    store: str,
    window: str,
    nodes: list[dict[str, Any]],
    jobs: int,
    kills: int,
    seed: int,
    runtime_s: tuple[float, float] = (0.2, 3.0),
    timeout_s: float = 600.0,
    retrying: int = 0,
) -> ChaosReport:
    """Submit ``jobs``, kill -9 and restart the service ``kills`` times, wait, audit.

    ``retrying``: creates a retrying client makes meanwhile (their jobs are audited too).
    """
    runs = root / "runs"
    runs.mkdir(parents=True)
    rng = random.Random(seed)
    report = ChaosReport(store=store, window=window, jobs=jobs)
    service = ServiceProcess(
        root / "service",
        store_url=store_url,
        nodes=nodes,
        policy={"windows": [WINDOWS[window]]},
        tick_interval_s=0.1,
        poll_interval_s=0.2,
        inventory_interval_s=10.0,
    )
    engine = create_engine(store_url)
    began = time.monotonic()
    try:
        service.start()
        token = service.admin_token
        ids = []
        for _ in range(jobs):
            spec = job_spec(runs, rng.uniform(*runtime_s), rng.choice((1, 1, 1, 2, 4)))
            ids.append(service.api("POST", "jobs", {**spec, "retries": 2}, token=token)["id"])
        client = _retrying_client(service, runs, store_url, retrying, rng.random(), runtime_s)
        for k in range(kills):
            if k % 2 == 0:  # aimed: the moment a launch is under way
                deadline = time.monotonic() + 10
                while not _starting(engine) and time.monotonic() < deadline:
                    time.sleep(0.001)  # a launch on a warm node takes a few ms
            else:  # anywhere
                time.sleep(rng.uniform(0.3, 2.0))
            service.stop(sig=signal.SIGKILL)
            report.kills += 1
            # Asked once the service is dead, so nothing moves meanwhile: a job still starting
            # is a launch the kill cut (asked before the kill, a quick launch could end first).
            report.kills_in_launch += _starting(engine)
            restarted = time.monotonic()
            service.start()
            report.restart_to_answer_s.append(time.monotonic() - restarted)
            report.scheduler_start_s.append(_scheduler_start_s(service))
        if client is not None:
            report.retrying = client.join()
            ids += report.retrying.ids
        found = wait_ended(service, ids, timeout_s)
        report.elapsed_s = time.monotonic() - began
        report.not_succeeded, report.lost, report.run_twice, report.overlaps = outcomes(
            found, ids, runs
        )
        for i in {*report.run_twice, *report.lost, *report.not_succeeded}:
            report.details[i] = job_story(engine, runs, i)
        time.sleep(1.0)  # a last poll and probe
        cluster = service.api("GET", "cluster", token=token)
        report.gpus_held = [
            f"{n['name']}/{g['index']}: {g['state']} {[j['id'] for j in g['jobs']]}"
            for n in cluster["nodes"]
            for g in n["gpus"]
            if g["state"] not in ("free", "down") or g["jobs"]
        ]
        return report
    finally:
        service.stop()
        engine.dispose()


class _RetryingClient(threading.Thread):
    """:func:`retrying_submits` in a thread of its own, beside the kills."""

    def __init__(self, target: Any) -> None:
        super().__init__(daemon=True, name="retrying-client")
        self._target_fn = target
        self.report: RetryingReport | None = None

    def run(self) -> None:
        self.report = self._target_fn()

    def join(self, timeout: float | None = 600.0) -> RetryingReport:  # type: ignore[override]
        super().join(timeout)
        assert self.report is not None, "the retrying client did not finish"
        return self.report


def _retrying_client(
    service: ServiceProcess,
    runs: Path,
    store_url: str,
    creates: int,
    seed: float,
    runtime_s: tuple[float, float],
) -> _RetryingClient | None:
    if not creates:
        return None
    rng = random.Random(seed)
    specs = [{**job_spec(runs, rng.uniform(*runtime_s), 1), "retries": 2} for _ in range(creates)]
    client = _RetryingClient(
        lambda: retrying_submits(
            service.url,
            service.admin_token,
            jobs=creates,
            store_url=store_url,
            spec=lambda i: specs[i],
            tag="chaos",
        )
    )
    client.start()
    return client
