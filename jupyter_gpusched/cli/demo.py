"""``jupyter gpusched demo``: a short workload end to end on the embedded simulated cluster.

Starts the simulated nodes (real SSH servers on loopback, real processes) and a scheduler on a
temporary store, composed beside the server (:mod:`jupyter_gpusched.server.embedded`), and
submits a small mix: scripts on different GPU counts, a shared GPU, one that fails, one that
is cancelled, and a batch job the day window holds back. Prints the queue as it moves and a
text cluster map; exits 0 only when everything behaved as expected.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from traitlets import Bool, Float

from jupyter_gpusched.core.clock import OffsetClock
from jupyter_gpusched.core.models import Job, JobState, parse_spec
from jupyter_gpusched.server.embedded import Embedded, embedded

from .base import GpuSchedCommand
from .formats import format_cluster, format_queue

#: The demo runs as if it were Monday 10:00 UTC: the day window is in force.
DEMO_START = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


_TRAIN = (
    "import os, time\n"
    "gpus = os.environ['CUDA_VISIBLE_DEVICES'].split(',')\n"
    "for step in range({steps}):\n"
    "    print(f'step {{step}} on {{len(gpus)}} GPU(s)', flush=True)\n"
    "    time.sleep({pause})\n"
)


@dataclass(frozen=True)
class DemoJob:
    """One job of the demo workload and what it should end as."""

    key: str
    spec: dict[str, object]
    expect: JobState
    cancel_when_running: bool = False


WORKLOAD: tuple[DemoJob, ...] = (
    DemoJob(
        "train-8gpu-a",
        {
            "command": _py(_TRAIN.format(steps=6, pause=0.5)),
            "gpus": 8,
            "gpu_models": ["A100"],
            "name": "train-8gpu-a",
        },
        JobState.SUCCEEDED,
    ),
    DemoJob(
        "train-8gpu-b",
        {
            "command": _py(_TRAIN.format(steps=4, pause=0.5)),
            "gpus": 8,
            "gpu_models": ["A100"],
            "name": "train-8gpu-b",
        },
        JobState.SUCCEEDED,
    ),
    DemoJob(
        "held-by-day",
        {"command": _py(_TRAIN.format(steps=2, pause=0.3)), "gpus": 4, "name": "held-by-day"},
        JobState.SUCCEEDED,
    ),
    DemoJob(
        "finetune-2gpu",
        {
            "command": _py(_TRAIN.format(steps=3, pause=0.4)),
            "gpus": 2,
            "priority": "interactive",
            "name": "finetune-2gpu",
        },
        JobState.SUCCEEDED,
    ),
    DemoJob(
        "eval-shared",
        {
            "command": _py(_TRAIN.format(steps=2, pause=0.3)),
            "gpus": 1,
            "gpu_mem_gb": 8,
            "priority": "interactive",
            "name": "eval-shared",
        },
        JobState.SUCCEEDED,
    ),
    DemoJob(
        "broken",
        {
            "command": _py("import sys; print('loss is nan', file=sys.stderr); sys.exit(1)"),
            "gpus": 1,
            "priority": "interactive",
            "name": "broken",
        },
        JobState.FAILED,
    ),
    DemoJob(
        "cancel-me",
        {
            "command": _py("import time; time.sleep(300)"),
            "gpus": 1,
            "priority": "interactive",
            "name": "cancel-me",
        },
        JobState.CANCELLED,
        cancel_when_running=True,
    ),
)


@dataclass
class DemoResult:
    """What happened, for the exit code and for tests."""

    final: dict[str, Job] = field(default_factory=dict)
    held_reasons: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


async def run_demo(
    *, out: object = sys.stdout, timeout_s: float = 90.0, base_dir: Path | None = None
) -> DemoResult:
    """Run the workload; return what each job ended as and anything unexpected."""
    write = out.write  # type: ignore[attr-defined]
    result = DemoResult()
    with tempfile.TemporaryDirectory(prefix="gpusched-demo-") as tmp:
        async with embedded(
            base_dir or Path(tmp),
            clock=OffsetClock(DEMO_START),
            tick_interval_s=0.2,
            poll_interval_s=0.2,
            cancel_grace_s=2.0,
        ) as stack:
            sched, sim, nodes = stack.scheduler, stack.sim, stack.nodes
            write(
                f"embedded cluster: {len(nodes)} simulated nodes on 127.0.0.1 "
                f"(ports {', '.join(str(sim.port(n.name)) for n in nodes)})\n\n"
            )
            write(format_cluster(sched.cluster_view()) + "\n\n")
            ids = {}
            for job in WORKLOAD:
                ids[job.key] = sched.submit(
                    parse_spec({"kind": "script", **job.spec}, user="demo")
                ).id
            await _watch(stack, ids, result, write, timeout_s)
            write("\n" + format_cluster(sched.cluster_view()) + "\n")
    for job in WORKLOAD:
        got = result.final.get(job.key)
        if got is None or got.state is not job.expect:
            seen = got.state.value if got else "unfinished"
            result.problems.append(f"{job.key}: expected {job.expect.value}, got {seen}")
    if not any("interactive" in r for r in result.held_reasons):
        result.problems.append("no batch job was held back by the day window")
    return result


async def _watch(
    stack: Embedded, ids: dict[str, int], result: DemoResult, write: object, timeout_s: float
) -> None:
    sched = stack.scheduler
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last_table = ""
    cancelled = False
    by_id = {v: k for k, v in ids.items()}
    while loop.time() < deadline:
        jobs = [sched.get_job(i) for i in ids.values()]
        for job in jobs:
            if job.state is JobState.QUEUED and job.reason and "reserves" in job.reason:
                if job.reason not in result.held_reasons:
                    result.held_reasons.append(job.reason)
            spec = next(w for w in WORKLOAD if w.key == by_id[job.id])
            if spec.cancel_when_running and job.state is JobState.RUNNING and not cancelled:
                cancelled = True
                await sched.cancel(job.id, user="demo", reason="cancelled by the demo")
        views = [sched.job_view(sched.get_job(i)) for i in ids.values()]
        table = format_queue(views, now=sched.clock.now(), tz=UTC)  # the demo's own clock
        if table != last_table:
            write(f"--- {sched.clock.now():%a %H:%M:%S} UTC\n{table}\n")  # type: ignore[operator]
            last_table = table
        if all(
            sched.get_job(i).state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
            for i in ids.values()
        ):
            break
        await asyncio.sleep(0.2)
    for key, job_id in ids.items():
        result.final[key] = sched.get_job(job_id)


class DemoApp(GpuSchedCommand):
    """``jupyter gpusched demo [--headless]``: the workload above, on an embedded cluster."""

    command = "demo"
    description = (
        "Start the embedded simulated cluster and run a short workload end to end; exit 0 "
        "when every job behaved as expected."
    )

    headless = Bool(
        False, help="Plain output for scripts and CI; the exit code says if all went well."
    ).tag(config=True)
    timeout = Float(90.0, help="Give up after this many seconds.").tag(config=True)

    aliases = {**GpuSchedCommand.aliases, "timeout": "DemoApp.timeout"}
    flags = {
        **GpuSchedCommand.flags,
        "headless": ({"DemoApp": {"headless": True}}, "Plain output for scripts and CI."),
    }

    def check(self) -> None:  # noqa: D102
        self.positional("", at_most=0)

    def run(self) -> int:
        """Run the demo; 1 when something did not behave as expected."""
        result = asyncio.run(run_demo(timeout_s=self.timeout))
        if result.problems:
            print("\ndemo: something did not behave as expected:", file=sys.stderr)
            for problem in result.problems:
                print(f"  - {problem}", file=sys.stderr)
            return 1
        print(
            "\ndemo: every job ended as expected "
            f"({', '.join(f'{k} {v.state.value}' for k, v in result.final.items())}); "
            "a batch job waited for the day window's interactive reserve."
        )
        return 0
