"""The scheduler loop: reads the queue, asks policy and packer, acts through a backend.

Each :meth:`Scheduler.tick` is one pass: refresh inventory (when due), poll running jobs
(:class:`.tracking.JobTracker` records what they did), enforce runtime and idle limits, then
place queued jobs in policy order (:mod:`.placing`); a pass a submit asks for between the
interval's passes only places. What requests ask of the queue is :mod:`.actions`. The store
is the truth — every decision is written there before or right after acting, so a restart
finds everything again (:meth:`Scheduler.start` reattaches running jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from jupyter_gpusched.cluster.base import Backend
from jupyter_gpusched.core import api, windows
from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import UnavailableError
from jupyter_gpusched.core.estimates import StartEstimate
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.limits import UserLimits
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    Job,
    JobKind,
    JobState,
)
from jupyter_gpusched.core.privacy import Viewer
from jupyter_gpusched.core.usage import UsageTally
from jupyter_gpusched.packing import packer
from jupyter_gpusched.packing.inventory import (
    build_state,
    node_shape,
)
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.leader import LeaderLease, NotLeaderError, fenced
from jupyter_gpusched.store.store import Store
from jupyter_gpusched.store.writer import StoreWriter, usable_for

from .actions import JobActions
from .arrays import ArrayWork
from .endhooks import EndHook, EndHooks
from .events import EventHub
from .health import NO_NODE, NodeHealth, NodeWatch
from .history import GpuHistory
from .increments import PassMemo, QueuePositions
from .inventorying import Inventorying
from .launching import Launcher
from .limits import enforce_limits
from .placing import FAIR_SHARE_DAYS, Placing
from .shapes import Shapes
from .submits import GroupCommit
from .tracking import JobTracker, launched
from .views import ClusterSnapshot, cluster_view

log = logging.getLogger(__name__)

#: How often the leader looks for big arrays whose submit was cut off, seconds.
_CUT_ARRAYS_EVERY_S = 60.0
#: How a job of each kind turns into the argv the backend launches; kinds register here.
CommandBuilder = Callable[[Job], Sequence[str]]
#: Called at every tick with the current time, e.g. to fire recurring job definitions.
TickHook = Callable[[datetime], Awaitable[None]]


def script_command(job: Job) -> Sequence[str]:
    """A script job runs its own argv."""
    assert job.spec.command is not None
    return job.spec.command


class Scheduler(JobActions, ArrayWork, Placing, Inventorying):
    """One cluster queue. All public methods are safe to call from request handlers."""

    def __init__(
        self,
        *,
        store: Store,
        backend: Backend,
        policy: windows.PolicyConfig,
        clock: Clock,
        packer_policy: str = "fragmentation",
        tick_interval_s: float = 1.0,
        poll_interval_s: float = 2.0,
        inventory_interval_s: float = 30.0,
        cancel_grace_s: float = 10.0,
        leader_ttl_s: float = 6.0,
        admins: frozenset[str] = frozenset(),
        commands: dict[JobKind, CommandBuilder] | None = None,
        gpu_history_samples: int = 2880,
        store_writer_process: bool = True,
        node_down_after_s: float = 300.0,
    ) -> None:
        self.store = store
        self.backend = backend
        self.policy = policy
        self.clock = clock
        self.packer_policy = packer_policy
        self.tick_interval_s = tick_interval_s
        self.inventory_interval_s = inventory_interval_s
        self.cancel_grace_s = cancel_grace_s
        self.admins = admins
        self.commands: dict[JobKind, CommandBuilder] = {JobKind.SCRIPT: script_command}
        self.commands.update(commands or {})
        self._end = EndHooks(self.store)
        self.end_hooks: list[EndHook] = self._end.hooks  # features append theirs
        self.tick_hooks: list[TickHook] = []
        self._inventory: list[NodeInventory] = []
        self._inventory_at: float | None = None
        self._probing: asyncio.Task[list[NodeInventory]] | None = None  # a periodic probe
        # A cluster engine that declares nodes down itself (Slurm, after SlurmdTimeout) has
        # waited its own grace already.
        grace_s = 0.0 if getattr(backend, "declares_nodes_down", False) else node_down_after_s
        self.health = NodeHealth(self._unreachable, clock, grace_s)
        self._watch = NodeWatch(self.health.unreachable)
        self.tracker = JobTracker(
            store,
            backend,
            clock,
            node_down=self.health.down,
            settled=self.health.placeable,
            on_ended=self._note_ended,
            poll_interval_s=poll_interval_s,
            cancel_grace_s=cancel_grace_s,
        )
        self.launcher = Launcher(store, backend, self.tracker, clock, self.commands)
        self._base: packer.ClusterState | None = None
        self._base_key: tuple[Any, ...] = ()
        self._base_for: list[NodeInventory] | None = None  # the inventory it was checked for
        self._usage_tally = UsageTally()
        self._positions = QueuePositions()
        self._estimates: dict[int, StartEstimate | None] = {}  # expected starts, by each pass
        self._reasons: dict[int, str | None] = {}
        self._queue_was = 0
        self._shapes = Shapes()
        self._memo: PassMemo | None = None
        self._need_full = True
        self._cut_arrays_at: float | None = None  # when cut-off arrays were last looked for
        # Between full passes the queue's answers are trusted this long at most (less when a
        # full pass is cheap): fair-share usage, quotas and expected starts drift with time.
        self.full_pass_every_s = 10.0
        # Each owner's latest finished jobs, for runtime estimates: read when first needed and
        # kept until a job ends (a pass with thousands queued asked for them every time).
        self._history: dict[str, list[Job]] = {}
        self.gpu_history = GpuHistory(gpu_history_samples)
        # How long a node stays kept for the job batch jobs were moved off it for.
        self.claim_ttl_s = 900.0
        self._no_move: tuple[Any, ...] | None = None  # the last situation no move paid in
        self._task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.leader_ttl_s = leader_ttl_s
        self._lease: LeaderLease | None = None
        self._epoch: int | None = None  # the lease's epoch while this scheduler leads
        self._lease_until = datetime.min.replace(tzinfo=UTC)
        self._reattach = False
        self._told_standby = False
        self._stopping = False
        self.stop_grace_s = 10.0
        self._wake = asyncio.Event()
        # Wakes are coalesced: a pass starts at least this long after the previous one ended
        # (longer when passes take longer), so a burst of submits costs one pass, not one each.
        self.wake_coalesce_s = 0.02
        self._pass_s = 0.0  # how long the last pass took
        # When a pass last did its upkeep, in the loop's time like the interval's timeout (a
        # manual clock that stands still must not put upkeep off for good).
        self._upkeep_at: float | None = None
        self._woken = False  # the next pass was asked for (a submit), not the interval's
        self._feasible: dict[tuple[Any, ...], str | None] = {}  # admission, by request shape
        self.callers: dict[str, tuple[frozenset[str], bool]] = {}  # see JobActions.note_caller
        self._submitting: dict[tuple[str, bool], int] = {}
        # Submits' transactions and the waiting reasons passes find, off the server's GIL.
        self._writer = (
            StoreWriter(store.url) if store_writer_process and usable_for(store.url) else None
        )
        self._group = GroupCommit(self.store, self.wake_for_new, writer=self._writer)
        self.events = EventHub(self.store, self.clock, cluster=self.cluster_view, job=self.job_view)
        self._tick_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Migrate the store, connect, claim the leader lease and start the loop.

        Every process that opens the store serves the API; only the one holding the leader
        lease (:mod:`jupyter_gpusched.store.leader`) polls, places, enforces limits and runs
        the hooks. The others stand by and take over when its lease lapses.
        """
        self.store.migrate()
        await self.backend.start()
        await self._refresh_inventory(force=True)
        self._lease = LeaderLease(self.store, ttl_s=self.leader_ttl_s)
        await self._hold_lease()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="gpusched-loop")
        self._lease_task = loop.create_task(self._keep_lease(), name="gpusched-lease")

    async def stop(self) -> None:
        """Stop the loop, hand the lease on and close connections; jobs keep running."""
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
            self._lease_task = None
        if self._task is not None:
            self._stopping = True
            self.wake()
            # Let a tick in progress finish its writes; cut it short only if it hangs.
            done, _ = await asyncio.wait([self._task], timeout=self.stop_grace_s)
            if not done:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
            self._stopping = False
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._probing
            self._probing = None
        if self._lease is not None and self._epoch is not None:
            with contextlib.suppress(Exception):  # a store that is gone frees it by time
                self._lease.release()
            self._epoch = None
        await self._group.close()
        if self._writer is not None:
            await self._writer.close()
        await self.backend.close()

    @property
    def leading(self) -> bool:
        """Whether this scheduler holds the leader lease (and so acts on the queue)."""
        return self._epoch is not None

    async def _hold_lease(self) -> None:
        """Take or renew the lease; start or stop acting when that changed."""
        assert self._lease is not None
        began = self.clock.monotonic()
        try:
            lead = await asyncio.to_thread(self._lease.hold)
        except Exception as exc:  # the store is away: act only while our lease surely holds
            if self._epoch is not None and self.clock.now() >= self._lease_until:
                log.warning("gpusched: cannot renew the leader lease (%s); standing by", exc)
                self._step_down()
            return
        took_s = self.clock.monotonic() - began
        if took_s > self.leader_ttl_s / 3:
            log.warning("gpusched: the leader lease check took %.1f s", took_s)
        if lead.mine:
            self._lease_until = lead.expires_at
            if self._epoch != lead.epoch:
                log.info("gpusched: this scheduler leads the queue (epoch %s)", lead.epoch)
                self._epoch = lead.epoch
                self._reattach = True
                self.wake()
        elif self._epoch is not None:
            log.warning("gpusched: %s took the leader lease; standing by", lead.holder)
            self._step_down()
        elif not self._told_standby:
            self._told_standby = True
            log.info("gpusched: standing by while %s leads the queue", lead.holder)

    def _step_down(self) -> None:
        self._epoch = None
        self._told_standby = False

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.leader_ttl_s / 3)
            await self._hold_lease()
            await asyncio.to_thread(self.store.trim_wal)  # readers can keep SQLite's WAL growing

    async def _run(self) -> None:
        # The count of all jobs and the fortnight of usage fair share weighs, read off the
        # loop once: the first page and pass then read only what is new, and the API answers
        # while this reads.
        with contextlib.suppress(Exception):  # a store away: the first pass reads it then
            await off_the_loop(self.store.list_jobs, limit=0)
            since = self.clock.now() - timedelta(days=FAIR_SHARE_DAYS)
            await off_the_loop(self.store.usage_stretches, since=since)
        while not self._stopping:
            began = self.clock.monotonic()
            try:
                if self._epoch is not None:
                    assert self._lease is not None
                    with fenced(self._lease.holder, self._epoch):
                        if self._reattach:  # just became leader: find running jobs again
                            await self.tracker.poll_active(force=True)
                            self._end.forget()
                            self._history.clear()  # jobs the last leader ended
                            self._reattach = False
                        await self.tick(upkeep=self._upkeep_due())
                else:
                    await self._refresh_inventory()  # views stay live while standing by
                    await self.notify()
            except NotLeaderError as exc:
                log.warning("gpusched: %s; standing by", exc.message)
                self._step_down()
            except UnavailableError:
                pass  # the store said why, once; the next tick tries again
            except Exception:  # the loop must outlive any one bad tick
                log.exception("gpusched: scheduler tick failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for can turn a cancellation that
            # races its timeout into a TimeoutError, and the loop would never stop.
            ended = self.clock.monotonic()
            self._pass_s = ended - began
            with contextlib.suppress(TimeoutError):
                self._woken = False
                async with asyncio.timeout(self.tick_interval_s):
                    await self._wake.wait()
                    self._woken = True
                    # Let the changes of a burst gather into one pass: the next starts at least
                    # twice as long after this one as a pass takes (capped), so passes hold the
                    # loop a third of the time at most while requests pour in. A wake after a
                    # quiet spell runs at once: submit -> start pays no wait.
                    gap = min(max(self.wake_coalesce_s, 2 * self._pass_s), 1.0)
                    await asyncio.sleep(max(0.0, ended + gap - self.clock.monotonic()))
            self._wake.clear()

    def wake(self) -> None:
        """Run the next tick now rather than at the next interval, weighing the whole queue."""
        self._need_full = True
        self._wake.set()

    def wake_for_new(self) -> None:
        """:meth:`wake` after jobs were queued and nothing else changed (:mod:`.increments`)."""
        self._wake.set()

    # ------------------------------------------------------------------ the pass
    def _upkeep_due(self) -> bool:
        """Whether the next pass does its upkeep: always, but on a wake soon after the last."""
        if not self._woken or self._upkeep_at is None:
            return True
        return asyncio.get_running_loop().time() - self._upkeep_at >= self.tick_interval_s

    async def tick(self, *, upkeep: bool = True) -> None:
        """One scheduling pass.

        ``upkeep=False``: placing only. A pass a submit asked for between the interval's
        passes skips what the last one did moments ago (resuming cut launches, polling,
        reaping, runtime limits, the tick hooks), which was a fifth of submit -> start.
        """
        async with self._tick_lock:
            now = self.clock.now()
            active = windows.resolve_window(self.policy, now)
            await self._refresh_inventory()
            if upkeep:
                self._upkeep_at = asyncio.get_running_loop().time()
                await self._declare_down()
                await self._resume_launches()
                await self.tracker.poll_active()
                await self._refresh_inventory()  # a node its jobs were lost on shows down now
                await self.tracker.reap_stale()
                await enforce_limits(self.store, self.tracker, now, active.window)
                self._cancel_cut_arrays()
                for hook in self.tick_hooks:
                    await hook(now)
            await asyncio.sleep(0)  # requests waiting meanwhile go first: a pass is long
            await self._schedule(now, active)
            await asyncio.sleep(0)
            await self._end.run()
        await self.notify()

    async def _resume_launches(self) -> None:
        """Settle ``starting`` jobs whose launch did not return (a crash, a takeover)."""
        starting, _ = self.store.list_jobs(states=[JobState.STARTING], limit=1_000_000)
        for job in starting:
            if launched(job):
                continue
            node = job.placement.node if job.placement else ""
            if self.health.down(node):
                # It cannot be confirmed; its attempt is claimed when the node is back.
                self.tracker.lose(job, f"node {node} went down while the job was starting")
                continue
            if self.health.unreachable(node):
                continue  # suspect: settled when it answers, or lost once it is down
            await self.launcher.resume(job)

    def _cancel_cut_arrays(self) -> None:
        """Now and then, cancel big arrays whose submit a killed server cut off."""
        mono = self.clock.monotonic()
        if self._cut_arrays_at is not None and mono - self._cut_arrays_at < _CUT_ARRAYS_EVERY_S:
            return
        self._cut_arrays_at = mono
        if self.cancel_cut_arrays():
            self.wake()

    def _note_ended(self, job_id: int) -> None:
        self._history.clear()  # runtime estimates read the owners' finished jobs again
        self._end.ended(job_id)

    # ------------------------------------------------------------------ placing
    def _empty_state(self) -> packer.ClusterState:
        """The cluster with nothing placed, rebuilt only when the nodes' shapes change.

        Checked once per inventory (each probe replaces the list): every submit asks.
        """
        if self._base is not None and self._base_for is self._inventory:
            return self._base
        self._base_for = self._inventory
        shapes = [node_shape(n) for n in self._inventory if n.gpus or n.cpus]
        key = tuple(shapes)
        if self._base is None or key != self._base_key:
            # No node ever answered: an empty stand-in, down, so the API and the queue work.
            self._base = packer.ClusterState.from_nodes(shapes or [NO_NODE])
            if not shapes:
                self._base.set_node_up(0, False)
            self._base_key = key
        return self._base

    def _cluster_state(
        self, active_jobs: Sequence[Job] | None = None
    ) -> tuple[packer.ClusterState, dict[str, int]]:
        """The packer's state: the nodes with ``active_jobs`` (default: read them) placed."""
        if active_jobs is None:
            active_jobs, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=None)
        state = build_state(
            self._empty_state(),
            self._inventory,
            active_jobs,
            lambda name: not self.health.placeable(name),
        )
        return state, dict(state.index)

    # ------------------------------------------------------------------ views and events
    def snapshot(self) -> ClusterSnapshot:
        """Inventory, packer state and active jobs at this instant, for the views."""
        now = self.clock.now()
        active_jobs, _ = self.store.list_jobs(states=list(ACTIVE_STATES), limit=None)
        state, _ = self._cluster_state(active_jobs)
        _, queued = self.store.list_jobs(states=[JobState.QUEUED], limit=0)
        return ClusterSnapshot(
            inventory=self._inventory,
            state=state,
            jobs=active_jobs,
            queued=queued,
            window=windows.resolve_window(self.policy, now),
            now=now,
            unreachable=self.health.unreachable_view(n.name for n in self._inventory),
        )

    def cluster_view(self) -> api.Cluster:
        """The API's cluster: nodes, GPUs with state and owner, metrics, window."""
        return cluster_view(self.snapshot())

    def policy_view(
        self, at: datetime | None = None, mine: UserLimits | None = None
    ) -> api.PolicyView:
        """Which rules hold at ``at`` (default now), and why; ``mine``: the caller's limits."""
        return windows.policy_view(self.policy, at or self.clock.now(), mine)

    async def notify(self) -> None:
        """Wake event subscribers now (e.g. after writing an event outside a tick)."""
        await self.events.notify(_inventory_key(self._inventory))

    @property
    def running(self) -> bool:
        """Whether the loop is ticking (between start and stop)."""
        return self._task is not None

    def subscribe(
        self,
        *,
        viewer: Viewer | None,
        after_id: int = 0,
        cluster_every_s: float | None = 1.0,
    ) -> AsyncIterator[api.EventMessage]:
        """Stored events after ``after_id`` (-1: only new ones), then live ones; see EventHub."""
        return self.events.subscribe(
            viewer=viewer, after_id=after_id, cluster_every_s=cluster_every_s
        )


def _inventory_key(nodes: Sequence[NodeInventory]) -> tuple[Any, ...]:
    """What of the inventory a cluster view shows (up/down, memory, processes)."""
    return tuple(
        (n.name, n.up, tuple((g.index, round(g.mem_used_mb), len(g.processes)) for g in n.gpus))
        for n in nodes
    )
