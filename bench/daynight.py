"""Day/night value of the time-of-day policy: a seeded queue simulation with departures.

Run::

    .venv/bin/python bench/daynight.py            # 21 days, 4 nodes x 8 GPUs, seed 1
    .venv/bin/python bench/daynight.py --days 14 --seed 2 --json out.json

Workload (synthetic, diurnal, seeded; times in UTC, the policy's timezone; starts Monday
2026-11-23 00:00; the first two days warm the queue up and are not measured):

* **interactive leases** (``%%gpu``): Poisson arrivals, weekdays 3/h 08-10 and 17-20, 6/h
  10-17, 1/h 20-23, 0.2/h otherwise; weekends 1/h 09-19, 0.2/h otherwise. 1 GPU (65 %),
  2 (25 %) or 4 (10 %); held for lognormal(median 40 min, sigma 0.8) clipped to 5 min-4 h.
* **batch jobs**: Poisson around the clock, 3.2/h on weekdays 08-20 and 2/h otherwise, from
  8 users; 1 GPU (35 %), 2 (25 %), 4 (25 %), 8 (15 %); runtime lognormal(median 2.5 h,
  sigma 0.9) clipped to 10 min-24 h. 75 % declare a runtime (actual x U(1, 1.5), rounded up
  to 30 min), the rest do not (the policy estimates from the user's history). Batch work
  checkpoints every 30 min, so a stop loses the work since the last checkpoint, and a
  restart costs 5 more minutes (start-up, loading the checkpoint).

Demand comes to about 90-100 % of the cluster's capacity (printed per run), so a batch
backlog is there most nights. "Night util" in the figures is over the default policy's whole
night window (weeknights 20:00-08:00 and all weekend); "20-08 util" over the night hours
20:00-08:00 of all seven days; "weeknights" over Mon-Fri 20:00-08:00 alone. "Day wait"
covers leases asked for Mon-Fri 08:00-20:00.
Night utilization cannot exceed demand: where the batch queue runs dry, GPUs idle under
every scheduler.

Schedulers compared, all placing jobs with the product's packer (``packer.pack`` with the
default policy, as the scheduler calls it; 16 CPUs and 128 GB per GPU so only GPUs bind):

* ``fifo``: one queue in submission order; the head blocks everything behind it.
* ``static``: node 0 only for interactive leases, nodes 1-3 only for batch; each partition
  starts jobs in submission order, skipping those that do not fit.
* ``time-of-day``: ``jupyter_gpusched.core.policy`` under the default windows of
  ``jupyter_gpusched.core.windows`` (day Mon-Fri 08:00-20:00: 25 % reserved for leases, at
  most 75 % interactive, batch started by day stopped after 4 h, preemption for leases;
  night: no batch limit). Per pass:
  ``resolve_window`` -> ``fair_share_usage`` -> ``order_queue`` -> ``admit`` -> placement;
  a lease that does not fit triggers ``choose_preemptions`` (by day; the packer says which
  victims make room); the first job that cannot start gets ``reserved_start`` and later jobs
  start only if ``backfill_allowed`` on the node the packer picks, else on another node.
  Stopped jobs (preempted, or undeclared ones reaching the day limit) requeue their
  remaining work.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpusched.core import backfill as B  # noqa: E402
from jupyter_gpusched.core import policy as P  # noqa: E402
from jupyter_gpusched.core import preemption as PR  # noqa: E402
from jupyter_gpusched.core import windows as W  # noqa: E402
from jupyter_gpusched.core.models import Job, JobKind, JobSpec  # noqa: E402
from jupyter_gpusched.packing import packer  # noqa: E402
from jupyter_gpusched.packing.inventory import pack_request  # noqa: E402

T0 = datetime(2026, 11, 23, tzinfo=UTC)  # a Monday
HOUR = 3600.0
CHECKPOINT_S = 1800.0
CLAIM_S = 900.0  # as Scheduler.claim_ttl_s
RESTART_S = 300.0  # a stopped job's start-up and checkpoint load when it runs again


# ------------------------------------------------------------------ workload


@dataclass
class SimJob:
    id: int
    user: str
    interactive: bool
    gpus: int
    submit_s: float
    work_s: float  # remaining work
    declared_s: float | None
    done_s: float = 0.0
    first_start_s: float | None = None
    start_s: float | None = None
    reply: packer.PackReply | None = None  # where it runs
    epoch: int = 0  # bumps on every (re)start so stale finish events are ignored
    limit_s: float | None = None
    job: Job | None = None
    finished_s: float | None = None
    restarts: int = 0


def _rate(t_s: float, interactive: bool) -> float:
    when = T0 + timedelta(seconds=t_s)
    h, weekday = when.hour, when.weekday() < 5
    if interactive:
        if weekday:
            if 10 <= h < 17:
                return 6.0
            if 8 <= h < 20:
                return 3.0
            return 1.0 if 20 <= h < 23 else 0.2
        return 1.0 if 9 <= h < 19 else 0.2
    return 3.2 if weekday and 8 <= h < 20 else 2.0


def workload(days: int, seed: int) -> list[SimJob]:
    """Seeded arrivals by thinning a Poisson process with the hourly rates above."""
    rng = np.random.default_rng(seed)
    jobs: list[SimJob] = []
    end = days * 86400.0
    for interactive, peak in ((True, 6.0), (False, 3.2)):
        t = 0.0
        while True:
            t += rng.exponential(HOUR / peak)
            if t >= end:
                break
            if rng.random() > _rate(t, interactive) / peak:
                continue
            if interactive:
                gpus = int(rng.choice([1, 2, 4], p=[0.65, 0.25, 0.10]))
                dur = float(np.clip(rng.lognormal(math.log(40 * 60), 0.8), 300, 4 * HOUR))
                user, declared = f"i{rng.integers(12)}", None
            else:
                gpus = int(rng.choice([1, 2, 4, 8], p=[0.35, 0.25, 0.25, 0.15]))
                dur = float(np.clip(rng.lognormal(math.log(2.5 * HOUR), 0.9), 600, 24 * HOUR))
                user = f"b{rng.integers(8)}"
                declared = None
                if rng.random() < 0.75:
                    declared = math.ceil(dur * rng.uniform(1.0, 1.5) / 1800) * 1800.0
            jobs.append(SimJob(0, user, interactive, gpus, t, dur, declared))
    jobs.sort(key=lambda j: j.submit_s)
    for i, j in enumerate(jobs, 1):
        j.id = i
    return jobs


def _weeknight(when: datetime) -> bool:
    """Mon-Fri 20:00 to the next morning's 08:00 (weekends excluded)."""
    return (when.weekday() < 5 and when.hour >= 20) or (1 <= when.weekday() <= 5 and when.hour < 8)


def as_job(j: SimJob) -> Job:
    """The plain job the policy sees (remaining work declared, original submit time)."""
    declared = None
    if j.declared_s is not None:
        declared = max(600.0, j.declared_s - j.done_s + j.restarts * RESTART_S)
    spec = JobSpec(
        kind=JobKind.LEASE if j.interactive else JobKind.SCRIPT,
        command=None if j.interactive else ["python", "train.py"],
        gpus=j.gpus,
        user=j.user,
        max_runtime_s=declared,
    )
    return Job(id=j.id, spec=spec, submitted_at=T0 + timedelta(seconds=j.submit_s))


# ------------------------------------------------------------------ simulator


@dataclass
class Sim:
    nodes: int
    per_node: int
    days: int
    warmup_days: int
    scheduler: str
    config: W.PolicyConfig = field(default_factory=W.PolicyConfig)
    now_s: float = 0.0
    queue: list[SimJob] = field(default_factory=list)
    running: dict[int, SimJob] = field(default_factory=dict)
    events: list[tuple[float, int, str, int, int]] = field(default_factory=list)
    seq: int = 0
    history: dict[str, list[float]] = field(default_factory=dict)
    usage_records: list[P.UsageRecord] = field(default_factory=list)
    busy_by_hour: np.ndarray = field(default_factory=lambda: np.zeros((1, 24)))
    batch_night_gpu_s: float = 0.0
    night_s: float = 0.0
    night_busy_gpu_s: float = 0.0
    weeknight_s: float = 0.0
    weeknight_busy_gpu_s: float = 0.0
    nights_s: float = 0.0
    nights_busy_gpu_s: float = 0.0
    preemptions: int = 0
    migrations: int = 0
    claims: dict[str, tuple[int, float]] = field(default_factory=dict)
    limit_stops: int = 0
    lost_gpu_s: float = 0.0
    _usage_cache: tuple[float, dict[str, float]] = (-1.0, {})
    _window: W.ActiveWindow | None = None

    def __post_init__(self) -> None:
        shapes = [
            packer.NodeShape(f"n{i}", "SIM-80GB", 80.0, self.per_node, 16.0 * self.per_node,
                             128.0 * self.per_node)
            for i in range(self.nodes)
        ]  # fmt: skip
        self.state = packer.ClusterState.from_nodes(shapes)
        self.names = self.state.node_names
        self.busy_by_hour = np.zeros((self.days, 24))
        self.busy_batch = 0
        self.busy_int = 0

    @property
    def total(self) -> int:
        return self.nodes * self.per_node

    @property
    def free(self) -> list[int]:
        """Wholly free GPUs per node."""
        whole = (self.state.gm == packer.MILLI) & self.state.valid
        return [int(x) for x in whole.sum(axis=1)]

    def push(self, t: float, kind: str, job_id: int = 0, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, job_id, epoch))

    def when(self, t_s: float | None = None) -> datetime:
        return T0 + timedelta(seconds=self.now_s if t_s is None else t_s)

    def window(self) -> W.ActiveWindow:
        now = self.when()
        if self._window is None or (self._window.until is not None and now >= self._window.until):
            self._window = W.resolve_window(self.config, now)
            if self._window.until is not None:  # act on the new rules at the boundary
                self.push((self._window.until - T0).total_seconds(), "window")
        return self._window

    # -------------------------------------------------------------- accounting
    def advance(self, t: float) -> None:
        """Integrate busy GPUs over [now, t) into hourly bins and the night totals."""
        while self.now_s < t:
            hour_end = (math.floor(self.now_s / HOUR) + 1) * HOUR
            step_end = min(t, hour_end)
            dt = step_end - self.now_s
            day, hour = divmod(int(self.now_s // HOUR), 24)
            if day < self.days:
                self.busy_by_hour[day, hour] += (self.busy_int + self.busy_batch) * dt
                if day >= self.warmup_days and self._is_night(self.now_s):
                    self.night_s += dt
                    self.night_busy_gpu_s += (self.busy_int + self.busy_batch) * dt
                    self.batch_night_gpu_s += self.busy_batch * dt
                    if _weeknight(self.when()):
                        self.weeknight_s += dt
                        self.weeknight_busy_gpu_s += (self.busy_int + self.busy_batch) * dt
                    if not 8 <= self.when().hour < 20:
                        self.nights_s += dt
                        self.nights_busy_gpu_s += (self.busy_int + self.busy_batch) * dt
            self.now_s = step_end

    def _is_night(self, t_s: float) -> bool:
        return W.resolve_window(W.PolicyConfig(), self.when(t_s)).window.name == "night"

    # -------------------------------------------------------------- start / stop
    def start(self, j: SimJob, reply: packer.PackReply, limit_s: float | None = None) -> None:
        self.state.allocate(reply)
        j.reply, j.start_s, j.epoch, j.limit_s = reply, self.now_s, j.epoch + 1, limit_s
        if j.first_start_s is None:
            j.first_start_s = self.now_s
        self.running[j.id] = j
        if j.interactive:
            self.busy_int += j.gpus
        else:
            self.busy_batch += j.gpus
        if limit_s is not None and limit_s < j.work_s:
            self.push(self.now_s + limit_s, "limit", j.id, j.epoch)
        else:
            self.push(self.now_s + j.work_s, "finish", j.id, j.epoch)

    def stop(self, j: SimJob, *, requeue: bool) -> None:
        assert j.reply is not None and j.start_s is not None
        ran = self.now_s - j.start_s
        self._release(self.state, j)
        del self.running[j.id]
        if j.interactive:
            self.busy_int -= j.gpus
        else:
            self.busy_batch -= j.gpus
        self.usage_records.append(P.UsageRecord(j.user, j.gpus, self.when(j.start_s), self.when()))
        if requeue:
            kept = math.floor(ran / CHECKPOINT_S) * CHECKPOINT_S
            self.lost_gpu_s += (ran - kept + RESTART_S) * j.gpus
            j.work_s += RESTART_S - kept
            j.done_s += kept
            j.restarts += 1
            j.reply = j.start_s = None
            j.job = None
            self.queue.append(j)
        else:
            j.finished_s = self.now_s
            self.history.setdefault(j.user, []).append(j.done_s + ran)

    # -------------------------------------------------------------- passes
    @staticmethod
    def _release(state: packer.ClusterState, j: SimJob) -> None:
        assert j.reply is not None and j.reply.node is not None
        r = j.reply
        state.release(r.node, r.gpu_indices, r.share_per_gpu, cpus=r.cpus, mem_gb=r.mem_gb)

    def place(
        self, j: SimJob, state: packer.ClusterState | None = None, **where: Any
    ) -> packer.PackReply | None:
        """The packer's choice for ``j`` (``where``: ``only``/``exclude`` nodes), or None."""
        reply = packer.pack(state or self.state, pack_request(as_job(j).spec), **where)
        return reply if reply.node is not None else None

    def pass_fifo(self) -> None:
        self.queue.sort(key=lambda j: (j.submit_s, j.id))
        while self.queue:
            reply = self.place(self.queue[0])
            if reply is None:
                return
            self.start(self.queue.pop(0), reply)

    def pass_static(self) -> None:
        self.queue.sort(key=lambda j: (j.submit_s, j.id))
        for j in list(self.queue):
            reply = self.place(j, exclude=self.names[1:] if j.interactive else self.names[:1])
            if reply is not None:
                self.queue.remove(j)
                self.start(j, reply)

    def estimate(self, j: SimJob) -> float:
        job = j.job or as_job(j)
        return B.estimate_runtime_s(
            job,
            self.history.get(j.user, [])[-50:],
            percentile=self.config.runtime_percentile,
            default_s=self.config.default_runtime_s,
        )

    def usage(self, now: datetime) -> dict[str, float]:
        # The scheduler ticks often; fair share moves slowly, so refresh every 15 min.
        bucket = math.floor(self.now_s / 900)
        if self._usage_cache[0] != bucket:
            running = [
                P.UsageRecord(j.user, j.gpus, self.when(j.start_s), None)
                for j in self.running.values()
            ]
            usage = P.fair_share_usage(
                [*self.usage_records, *running], self.config.fairshare_half_life_s, now
            )
            self._usage_cache = (bucket, usage)
        return self._usage_cache[1]

    def pass_policy(self) -> None:
        """One scheduler pass, in the order ``Scheduler._schedule`` takes its steps."""
        now = self.when()
        active = self.window()
        w = active.window
        for j in self.queue:
            if j.job is None:
                j.job = as_job(j)
        by_id = {j.id: j for j in self.queue}
        self.claims = {
            node: (job_id, until) for node, (job_id, until) in self.claims.items()
            if job_id in by_id and until > self.now_s
        }  # fmt: skip
        order = P.order_queue([j.job for j in self.queue if j.job], self.usage(now), now, w)
        ctx = P.AdmissionContext(
            window=w, now=now, total_gpus=self.total, timezone=self.config.timezone
        )
        for r in self.running.values():
            ctx = P.add_to_context(ctx, r.job or as_job(r))
        reservation: B.Reservation | None = None
        for job in order.jobs:
            j = by_id[job.id]
            if sum(self.free) == 0 and not (j.interactive and w.preempt_batch):
                break
            admission = P.admit(job, ctx)
            if not admission:
                continue
            claimed = {n for n, (owner, _) in self.claims.items() if owner != j.id}
            reply = self.place(j, exclude=claimed)
            if reservation is not None and reply is not None:
                est = self.estimate(j)
                if not B.backfill_allowed(job, reservation, now, est, reply.node_name):
                    reply = self.place(j, exclude={*claimed, str(reservation.node)})
                if reply is not None:
                    reservation = B.consume_spare(
                        reservation, j.gpus, node=reply.node_name,
                        ends_at=now + timedelta(seconds=est),
                    )  # fmt: skip
            if reply is None and j.interactive and reservation is None:
                reply = self.preempt_for(j, w, now)
            if reply is not None:
                self.queue.remove(j)
                self.start(j, reply, admission.runtime_limit_s)
                ctx = P.add_to_context(ctx, job)
            elif any(owner == j.id for owner, _ in self.claims.values()):
                mine = next(n for n, (owner, _) in self.claims.items() if owner == j.id)
                reservation = reservation or B.Reservation(now, mine, 0.0)
            elif reservation is None:
                reservation = self.reserve(j, now)
                if not j.interactive and w.migrate_batch:
                    node = self.migrate_for(j, w, now, reservation)
                    if node is not None:
                        reservation = B.Reservation(now, node, 0.0)

    def checkpoint(self, r: SimJob) -> datetime:
        """The last checkpoint of a running job (every CHECKPOINT_S since it started)."""
        assert r.start_s is not None
        kept = math.floor((self.now_s - r.start_s) / CHECKPOINT_S) * CHECKPOINT_S
        return self.when(r.start_s + kept)

    def preempt_for(self, j: SimJob, w: W.Window, now: datetime) -> packer.PackReply | None:
        batch = [r for r in self.running.values() if not r.interactive]

        cands = [
            PR.PreemptCandidate(r.id, r.gpus, self.when(r.start_s), self.checkpoint(r))
            for r in batch
        ]
        by_id = {r.id: r for r in batch}
        request = pack_request(as_job(j).spec)

        def fits(ids: frozenset[int]) -> bool:
            trial = self.state.copy()
            for i in ids:
                self._release(trial, by_id[i])
            return packer.pack(trial, request).node is not None

        victims = PR.choose_preemptions(j.gpus, cands, now, fits, window=w)
        if not victims:
            return None
        for v in victims:
            self.preemptions += 1
            self.stop(by_id[v], requeue=True)
        return self.place(j)

    def migrate_for(
        self, j: SimJob, w: W.Window, now: datetime, reservation: B.Reservation
    ) -> str | None:
        """``moves.plan_migration`` on the sim's jobs: the node opened for ``j``, or None."""
        batch = [r for r in self.running.values() if not r.interactive and r.reply is not None]
        by_id = {r.id: r for r in batch}
        cands = [
            PR.PreemptCandidate(r.id, r.gpus, self.when(r.start_s), self.checkpoint(r),
                               str(r.reply.node_name) if r.reply else None)
            for r in batch
        ]  # fmt: skip

        def plan(node: str, ids: frozenset[int]) -> bool:
            moved = sorted((by_id[i] for i in ids), key=lambda r: -r.gpus)
            trial = self.state.copy()
            for r in moved:
                self._release(trial, r)
            for r, where in ((j, {"only": node}), *((r, {}) for r in moved)):
                reply = self.place(r, trial, **where)
                if reply is None:
                    return False
                trial.allocate(reply)
            return True

        free = {name: float(f) for name, f in zip(self.names, self.free, strict=True)}
        move = PR.choose_migration(
            j.gpus, free, cands, now, reservation.start, plan, window=w, restart_s=RESTART_S
        )
        if move is None:
            return None
        for v in move.job_ids:
            self.migrations += 1
            self.stop(by_id[v], requeue=True)
        self.claims[move.node] = (j.id, self.now_s + CLAIM_S)
        self.push(self.now_s, "wake")  # the moved jobs restart in a pass right after this one
        return move.node

    def reserve(self, j: SimJob, now: datetime) -> B.Reservation:
        releases = []
        for r in self.running.values():
            assert r.start_s is not None and r.reply is not None
            est = self.estimate(r) if not r.interactive else 3600.0
            if r.limit_s is not None:
                est = min(est, r.limit_s)
            end = max(now, self.when(r.start_s + est))
            releases.append(B.Release(str(r.reply.node_name), r.gpus, end))
        free = {name: float(f) for name, f in zip(self.names, self.free, strict=True)}
        return B.reserved_start(j.gpus, releases, free, now)

    # -------------------------------------------------------------- run
    def run(self, jobs: list[SimJob]) -> dict[str, object]:
        for j in jobs:
            self.push(j.submit_s, "arrive", j.id)
        by_id = {j.id: j for j in jobs}
        if self.scheduler == "time-of-day":
            self.window()
        end = self.days * 86400.0
        passes: dict[str, Callable[[], None]] = {
            "fifo": self.pass_fifo,
            "static": self.pass_static,
            "time-of-day": self.pass_policy,
        }
        while self.events and self.events[0][0] < end:
            t = self.events[0][0]
            self.advance(t)
            while self.events and self.events[0][0] == t:
                _, _, kind, job_id, epoch = heapq.heappop(self.events)
                ev = by_id.get(job_id)
                if kind == "arrive" and ev is not None:
                    self.queue.append(ev)
                elif kind in ("finish", "limit") and ev is not None and ev.epoch == epoch:
                    if ev.id in self.running:
                        if kind == "limit":
                            self.limit_stops += 1
                        self.stop(ev, requeue=kind == "limit")
            passes[self.scheduler]()
        self.advance(end)
        return self.metrics(jobs)

    def metrics(self, jobs: list[SimJob]) -> dict[str, object]:
        end = self.days * 86400.0
        waits = []
        for j in jobs:
            if not j.interactive or j.submit_s < self.warmup_days * 86400.0:
                continue
            when = self.when(j.submit_s)
            if when.weekday() >= 5 or not 8 <= when.hour < 20:
                continue
            started = j.first_start_s if j.first_start_s is not None else end
            waits.append((started - j.submit_s) / 60.0)
        measured = self.busy_by_hour[self.warmup_days :]
        weekdays = [
            d for d in range(self.warmup_days, self.days) if (T0 + timedelta(days=d)).weekday() < 5
        ]
        util_by_hour = self.busy_by_hour[weekdays].sum(axis=0) / (len(weekdays) * HOUR * self.total)
        return {
            "scheduler": self.scheduler,
            "interactive_day_requests": len(waits),
            "interactive_wait_p50_min": float(np.percentile(waits, 50)) if waits else 0.0,
            "interactive_wait_p95_min": float(np.percentile(waits, 95)) if waits else 0.0,
            "interactive_wait_p99_min": float(np.percentile(waits, 99)) if waits else 0.0,
            "night_util": self.night_busy_gpu_s / (self.night_s * self.total),
            "weeknight_util": self.weeknight_busy_gpu_s / (self.weeknight_s * self.total),
            "nights_util": self.nights_busy_gpu_s / (self.nights_s * self.total),
            "batch_gpu_h_at_night_per_day": self.batch_night_gpu_s
            / HOUR
            / (self.days - self.warmup_days),
            "util_overall": float(measured.sum() / (measured.size * HOUR * self.total)),
            "util_by_hour_weekdays": [round(float(u), 3) for u in util_by_hour],
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "limit_stops": self.limit_stops,
            "lost_gpu_h": self.lost_gpu_s / HOUR,
            "batch_done": sum(1 for j in jobs if not j.interactive and j.finished_s is not None),
            "queued_at_end": len(self.queue),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=21)
    parser.add_argument("--warmup-days", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    jobs_proto = workload(args.days, args.seed)
    n_int = sum(j.interactive for j in jobs_proto)
    demand = sum(j.gpus * j.work_s for j in jobs_proto) / HOUR
    print(
        f"workload: seed {args.seed}, {args.days} days from {T0:%a %Y-%m-%d}, "
        f"{args.nodes}x{args.gpus_per_node} GPUs, {n_int} leases, "
        f"{len(jobs_proto) - n_int} batch jobs, demand {demand:,.0f} GPU-h "
        f"({demand / (args.days * 24 * args.nodes * args.gpus_per_node):.0%} of capacity)"
    )
    results = []
    for name in ("fifo", "static", "time-of-day"):
        jobs = workload(args.days, args.seed)  # fresh copies: the sim mutates jobs
        sim = Sim(args.nodes, args.gpus_per_node, args.days, args.warmup_days, name)
        results.append(sim.run(jobs))

    head = (
        f"{'scheduler':<12} {'day wait p50':>12} {'day wait p95':>12} {'p99':>8} "
        f"{'night util':>10} {'20-08 util':>10} {'weeknights':>10} "
        f"{'batch GPU-h/night':>17} {'util':>6} {'preempt':>7} {'moved':>5} {'limit':>5} "
        f"{'lost GPU-h':>10} {'queued':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['scheduler']:<12} {r['interactive_wait_p50_min']:>10.1f}m "
            f"{r['interactive_wait_p95_min']:>10.1f}m {r['interactive_wait_p99_min']:>7.1f}m "
            f"{r['night_util']:>10.1%} {r['nights_util']:>10.1%} "
            f"{r['weeknight_util']:>10.1%} "
            f"{r['batch_gpu_h_at_night_per_day']:>17.0f} {r['util_overall']:>6.1%} "
            f"{r['preemptions']:>7} {r['migrations']:>5} {r['limit_stops']:>5} "
            f"{r['lost_gpu_h']:>10.1f} {r['queued_at_end']:>6}"
        )
    print("\nutilization by hour of day (weekdays, %):")
    print(f"{'':<12} " + " ".join(f"{h:>3}" for h in range(24)))
    for r in results:
        row = " ".join(f"{u * 100:>3.0f}" for u in r["util_by_hour_weekdays"])  # type: ignore[attr-defined]
        print(f"{r['scheduler']:<12} {row}")
    fifo, tod = results[0], results[2]
    # A p95 of zero would make any ratio infinite: floor the policy's p95 at one minute.
    floor = max(float(tod["interactive_wait_p95_min"]), 1.0)  # type: ignore[arg-type]
    ratio = float(fifo["interactive_wait_p95_min"]) / floor  # type: ignore[arg-type]
    print(
        f"\ntargets: day p95 wait cut >= {ratio:,.0f}x vs FIFO (want >= 5x); "
        f"night window util {tod['night_util']:.1%} (20:00-08:00 {tod['nights_util']:.1%}, "
        f"weeknights {tod['weeknight_util']:.1%}; want >= 90%)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
