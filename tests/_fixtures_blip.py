"""Network blips between the service and its nodes while jobs run: nothing may be redone.

Used by ``tests/test_chaos.py`` (CI-sized) and ``bench/chaos.py``. The nodes run in a process
of their own and the service reaches each through a loopback forwarder whose line is cut now
and then (every SSH connection resets, new ones are refused; the nodes and their jobs run on).
Blips last less than the service's grace (``node_down_after_s``) but long enough for the
service to count the node unreachable (3 failed connects, a few seconds): no job may be
killed, run twice, lost or end other than succeeded. Each job writes a line when it starts
and when it ends (:data:`_fixtures_failover.JOB_CODE`), so a second run shows in what the
nodes saw.

One *long* cut, past the grace, shows the other side: the cut node's jobs are requeued; when
the line returns, an attempt still running there is re-adopted if its retry has not started,
else stopped with a ``kill`` event. The report counts which.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from _fixtures_chaos import job_story, outcomes, wait_ended
from _fixtures_failover import job_spec
from _fixtures_proxy import CuttableProxy
from _fixtures_service import ServiceProcess
from sqlalchemy import create_engine, text

T = TypeVar("T")


class Lines:
    """A :class:`CuttableProxy` in front of each node, served by a loop in a thread of its own."""

    def __init__(self, nodes: list[dict[str, Any]], folder: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.proxies: dict[str, CuttableProxy] = {}
        self.nodes: list[dict[str, Any]] = []
        known = folder / "known_hosts"
        lines = []
        for node in nodes:
            proxy = CuttableProxy(node["host"], node["port"])
            self._call(proxy.start())
            self.proxies[node["name"]] = proxy
            self.nodes.append({**node, "port": proxy.port, "known_hosts": str(known)})
            # the node's host key, listed under the port the service now dials
            original = Path(node["known_hosts"]).read_text()
            prefix = f"[127.0.0.1]:{node['port']} "
            for line in original.splitlines():
                if line.startswith(prefix):
                    lines.append(f"[127.0.0.1]:{proxy.port} {line.removeprefix(prefix)}")
        known.write_text("\n".join(lines) + "\n")

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def cut(self, name: str) -> None:
        """The line to ``name`` goes."""
        self._call(self.proxies[name].cut())

    def restore(self, name: str) -> None:
        """The line to ``name`` is back."""
        self._call(self.proxies[name].restore())

    def close(self) -> None:
        """Cut every line for good and stop the thread."""
        for proxy in self.proxies.values():
            self._call(proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class BlipReport:
    """What one run saw."""

    store: str
    jobs: int
    blips: int = 0
    blip_s: list[float] = field(default_factory=list)
    not_succeeded: dict[int, str] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)  # ended lost, or never ran
    run_twice: list[int] = field(default_factory=list)  # work redone
    killed: list[int] = field(default_factory=list)  # jobs with a `kill` event
    overlaps: list[str] = field(default_factory=list)
    long_cut_jobs: int = 0  # jobs running on the node cut past the grace
    readopted: int = 0
    stopped_copies: int = 0
    elapsed_s: float = 0.0
    details: dict[int, list[str]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Blips within the grace redid, killed and lost nothing."""
        return not (
            self.not_succeeded or self.lost or self.run_twice or self.killed or self.overlaps
        )

    def line(self) -> str:
        """One row of the bench's table."""
        cuts = sorted(self.blip_s) or [0.0]
        return (
            f"| {self.store} | {self.jobs} | {self.blips} ({cuts[0]:.1f}-{cuts[-1]:.1f} s) | "
            f"{len(self.lost)} | {len(self.run_twice)} | {len(self.killed)} | "
            f"{len(self.not_succeeded)} | {len(self.overlaps)} | {self.long_cut_jobs}: "
            f"{self.readopted} re-adopted, {self.stopped_copies} stopped | "
            f"{self.elapsed_s:.0f} s |"
        )


def _events(engine: Any, kind: str) -> list[tuple[int, str]]:
    query = text("SELECT job_id, detail FROM events WHERE kind = :k AND job_id IS NOT NULL")
    with engine.connect() as conn:
        return [(int(j), str(d)) for j, d in conn.execute(query, {"k": kind})]


def _reasons(engine: Any, needle: str) -> set[int]:
    query = text("SELECT job_id, detail FROM events WHERE kind = 'state'")
    with engine.connect() as conn:
        return {int(j) for j, d in conn.execute(query) if needle in str(d)}


def _busy_node(service: ServiceProcess, rng: random.Random, calm: dict[str, float]) -> str | None:
    """A node where a job runs now (a cut there has work to lose) and that has been calm.

    A node cut again moments after its line came back is one outage, not two blips: each
    node's blips are a grace apart (``calm``: node -> when it may be cut again).
    """
    listed = service.api("GET", "jobs?state=running&limit=1000", token=service.admin_token)
    busy = sorted({j["placement"]["node"] for j in listed["jobs"] if j.get("placement")})
    ready = [n for n in busy if calm.get(n, 0.0) <= time.monotonic()]
    return rng.choice(ready) if ready else None


def run_blips(
    root: Path,
    *,
    store_url: str,
    store: str,
    nodes: list[dict[str, Any]],
    jobs: int,
    blips: int,
    seed: int,
    grace_s: float = 20.0,
    blip_s: tuple[float, float] = (4.0, 12.0),
    runtime_s: tuple[float, float] = (10.0, 30.0),
    long_cut: bool = True,
    timeout_s: float = 600.0,
) -> BlipReport:
    """Run ``jobs`` through ``blips`` cuts of a node's line shorter than the grace; audit."""
    runs = root / "runs"
    runs.mkdir(parents=True)
    rng = random.Random(seed)
    report = BlipReport(store=store, jobs=jobs)
    lines = Lines(nodes, root)
    service = ServiceProcess(
        root / "service",
        store_url=store_url,
        nodes=lines.nodes,
        tick_interval_s=0.1,
        poll_interval_s=0.2,
        inventory_interval_s=2.0,
        node_down_after_s=grace_s,
    )
    engine = create_engine(store_url)
    began = time.monotonic()
    try:
        service.start()
        token = service.admin_token
        ids = []
        for _ in range(jobs):
            spec = job_spec(runs, rng.uniform(*runtime_s), rng.choice((1, 1, 2)))
            ids.append(service.api("POST", "jobs", {**spec, "retries": 1}, token=token)["id"])
        calm: dict[str, float] = {}
        give_up = time.monotonic() + timeout_s
        while report.blips < blips:
            assert time.monotonic() < give_up, f"only {report.blips} blips found a busy node"
            time.sleep(rng.uniform(0.5, 2.0))
            name, cut_s = _busy_node(service, rng, calm), rng.uniform(*blip_s)
            if name is None:
                continue
            lines.cut(name)
            time.sleep(cut_s)
            lines.restore(name)
            calm[name] = time.monotonic() + grace_s
            report.blips += 1
            report.blip_s.append(cut_s)
        found = wait_ended(service, ids, timeout_s)
        report.elapsed_s = time.monotonic() - began
        report.not_succeeded, report.lost, report.run_twice, report.overlaps = outcomes(
            found, ids, runs
        )
        report.killed = sorted({j for j, _ in _events(engine, "kill")})
        for i in {*report.run_twice, *report.lost, *report.not_succeeded, *report.killed}:
            report.details[i] = job_story(engine, runs, i)
        if long_cut:
            _long_cut(service, lines, runs, rng, grace_s, report, engine)
        return report
    finally:
        service.stop()
        engine.dispose()
        lines.close()


def _long_cut(
    service: ServiceProcess,
    lines: Lines,
    runs: Path,
    rng: random.Random,
    grace_s: float,
    report: BlipReport,
    engine: Any,
) -> None:
    """Cut busy nodes' lines past the grace; count re-adopted and stopped attempts.

    Two jobs can run only on the T4 node (their retries cannot start while it is away: the
    attempts still running there are re-adopted when it is back) and two anywhere but there
    (their retries start elsewhere: the attempts on the cut node are stopped when it is back).
    """
    token = service.admin_token
    long_s = grace_s * 3 + 10  # runs through the cut, the grace and the return
    groups = {"pinned": ["T4"], "free": ["V100-32GB", "A100-80GB"]}
    ids: dict[str, list[int]] = {}
    for group, models in groups.items():
        spec = {**job_spec(runs, long_s, 1), "retries": 1, "gpu_models": models}
        ids[group] = [service.api("POST", "jobs", spec, token=token)["id"] for _ in range(2)]
    every = [i for group in ids.values() for i in group]
    deadline = time.monotonic() + 120
    while True:
        listed = service.api("GET", "jobs?state=running&limit=1000", token=token)["jobs"]
        running = {j["id"]: j for j in listed if j["id"] in every}
        if len(running) == len(every) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    cut = sorted({running[i]["placement"]["node"] for i in every if i in running})
    report.long_cut_jobs = len(running)
    for node in cut:
        lines.cut(node)
    time.sleep(grace_s + 5 + rng.uniform(0, 2))
    for node in cut:
        lines.restore(node)
    wait_ended(service, every, long_s * 3 + 120)
    report.readopted = len(set(every) & _reasons(engine, "re-adopted"))
    report.stopped_copies = len({j for j, _ in _events(engine, "kill") if j in every})
