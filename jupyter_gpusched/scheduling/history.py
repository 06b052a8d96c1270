"""GPU history: every probe's utilization, memory and power per GPU, kept in memory.

A ring per GPU (``collections.deque(maxlen=keep)``), not a store table: the samples are
telemetry, not decisions — the store keeps what a restart must find again, and losing a
chart's past on a restart costs nothing a user relies on; one scheduler per cluster probes
(the lab-wide service's), so one process holds them; and writing ~1 row per GPU per probe
into the shared store (SQLite by default) would contend with the queue's own writes. The
ring bounds memory (``keep`` samples per GPU: 2880 = a day at the default 30 s probe
interval, ~0.5 MB for 22 GPUs). Each sample also records the jobs holding the GPU, so a
job's page can ask for "its GPUs over its life".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from jupyter_gpusched.core import api
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.models import Job

#: Most samples one series answers (older ones are merged into buckets).
MAX_POINTS = 2000


@dataclass(frozen=True)
class _Sample:
    at: datetime
    util_pct: float
    mem_used_gb: float
    power_w: float | None
    jobs: tuple[int, ...]


class GpuHistory:
    """Recent samples of every GPU of the cluster, ``keep`` per GPU."""

    def __init__(self, keep: int = 2880) -> None:
        self.keep = keep
        self._rings: dict[tuple[str, int], deque[_Sample]] = {}
        self._shape: dict[tuple[str, int], tuple[str, float]] = {}  # model, memory in GB
        self._probed: dict[str, datetime | None] = {}

    def record(
        self, inventory: Sequence[NodeInventory], jobs: Iterable[Job], now: datetime
    ) -> None:
        """Take one sample of each up node probed since the last call (others are stale)."""
        holders: dict[tuple[str, int], list[int]] = {}
        for job in jobs:
            if job.placement is not None:
                for g in job.placement.gpu_indices:
                    holders.setdefault((job.placement.node, g), []).append(job.id)
        for node in inventory:
            at = node.probed_at or now
            if not node.up or self._probed.get(node.name) == at:
                continue
            self._probed[node.name] = at
            for gpu in node.gpus:
                key = (node.name, gpu.index)
                ring = self._rings.get(key)
                if ring is None:
                    ring = self._rings[key] = deque(maxlen=self.keep)
                self._shape[key] = (gpu.model, round(gpu.mem_total_mb / 1024, 2))
                ring.append(
                    _Sample(
                        at,
                        float(gpu.util_pct),
                        round(gpu.mem_used_mb / 1024, 3),
                        gpu.power_w,
                        tuple(sorted(holders.get(key, ()))),
                    )
                )

    def series(
        self,
        *,
        node: str | None = None,
        gpus: Sequence[int] | None = None,
        job_id: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        points: int = 500,
    ) -> list[api.GpuSeries]:
        """Samples per GPU (filtered), at most ``points`` each: merged into buckets if more.

        ``job_id`` keeps the samples taken while that job held the GPU (its whole life, every
        attempt), and only the GPUs it held.
        """
        out = []
        for (name, index), ring in sorted(self._rings.items()):
            if (node is not None and name != node) or (gpus is not None and index not in gpus):
                continue
            samples = [
                s
                for s in ring
                if (since is None or s.at >= since)
                and (until is None or s.at <= until)
                and (job_id is None or job_id in s.jobs)
            ]
            if job_id is not None and not samples:
                continue
            samples = _merge(samples, max(2, min(points, MAX_POINTS)))
            model, mem_total_gb = self._shape[(name, index)]
            out.append(
                api.GpuSeries(
                    node=name,
                    index=index,
                    model=model,
                    mem_total_gb=mem_total_gb,
                    at=[s.at for s in samples],
                    util_pct=[s.util_pct for s in samples],
                    mem_used_gb=[s.mem_used_gb for s in samples],
                    power_w=[s.power_w for s in samples],
                    jobs=[list(s.jobs) for s in samples],
                )
            )
        return out


def _merge(samples: list[_Sample], points: int) -> list[_Sample]:
    """At most ``points`` samples: consecutive runs merged, stamped with their last instant.

    Utilization and power are averaged, memory keeps its peak, the jobs are all kept.
    """
    if len(samples) <= points:
        return samples
    size = -(-len(samples) // points)
    out = []
    for i in range(0, len(samples), size):
        run = samples[i : i + size]
        powers = [s.power_w for s in run if s.power_w is not None]
        out.append(
            _Sample(
                run[-1].at,
                round(sum(s.util_pct for s in run) / len(run), 1),
                max(s.mem_used_gb for s in run),
                round(sum(powers) / len(powers), 1) if powers else None,
                tuple(sorted({j for s in run for j in s.jobs})),
            )
        )
    return out
