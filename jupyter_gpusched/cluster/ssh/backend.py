"""SSH backend: GPU nodes reached over one pooled asyncssh connection each.

Everything remote goes through the node agent
(:mod:`jupyter_gpusched.node.agent`), started with a command line built by :func:`shlex.join`
from an argument list, so no user string is ever pasted into a shell line. Host keys are always
checked against a known_hosts file; there is no switch that turns checking off.

Failure model: every failed attempt to talk to a node (connect refused or timed out, connection
lost mid-command) counts as one consecutive failure; the next connect waits an exponential
backoff on the injected clock; ``down_after_failures`` failures in a row mark the node down. One
successful connect resets both.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncssh

from jupyter_gpusched.core.errors import BackendError, NodeRefusedError
from jupyter_gpusched.core.models import Job, Placement

from ..base import GpuInfo, GpuProcess, JobStatus, LaunchResult, NodeInventory
from .pool import NodePool, _Node

#: ``sh -c`` script for :meth:`SshBackend.poll`; job dir and pid come in as ``$1``/``$2``, never
#: pasted. /proc/PID/stat is read *before* the exit record: the wrapper writes the record before
#: it exits, so a pid seen gone or zombie always finds the record if there is one.
_STATUS_SH = (
    's=; { read -r s < "/proc/$2/stat"; } 2>/dev/null; '
    'if [ -f "$1/exit_code" ]; then '
    'c=; e=; read -r c < "$1/exit_code"; { read -r e < "$1/ended_at"; } 2>/dev/null; '
    'echo "exit $c $e"; '
    'else k=; { read -r k < "$1/checkpoint"; } 2>/dev/null; echo "stat ${k:--} $s"; fi'
)


def _stat_running(stat: str, start_time: int | None) -> bool:
    """Alive, not a zombie, and the same process (start time, /proc field 22) as launched."""
    if ")" not in stat:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return False
    return start_time is None or int(fields[19]) == int(start_time)


def _epoch(text: str) -> datetime | None:
    """A reported checkpoint time (Unix seconds), None when absent or garbled."""
    try:
        return datetime.fromtimestamp(float(text), tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


class SshBackend(NodePool):
    """A :class:`~jupyter_gpusched.cluster.base.Backend` on the node pool's SSH connections."""

    async def _agent(
        self, st: _Node, args: Sequence[str], *, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        argv = [*st.cfg.agent_argv(), *args]
        result = await self.run(st.cfg.name, argv, timeout_s=timeout_s)
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or result.exit_status != 0:
            # An exit status means the agent ran and said no; none means the channel went.
            error = NodeRefusedError if result.exit_status >= 0 else BackendError
            if isinstance(answer, dict) and answer.get("error"):
                raise error(f"node {st.cfg.name}: {args[0]}: {answer['error']}")
            why = (result.stderr or result.stdout or "").strip()[-1000:]
            raise error(
                f"node {st.cfg.name}: agent {args[0]} failed (exit {result.exit_status}): {why}; "
                f"is jupyter_gpusched importable by {' '.join(st.cfg.agent_argv())!r} there?"
            )
        return answer

    async def _probe(self, st: _Node) -> None:
        generation = st.probes
        async with st.probe_lock:
            if st.probes != generation:
                return  # a concurrent caller probed while we waited; its answer is fresh
            st.probes += 1
            st.probed_at = self._clock.monotonic()
            try:
                answer = await self._agent(st, ["probe"], timeout_s=60.0)
            except BackendError as exc:
                st.probe_error = exc.message
                return
            st.probe_error = None
            st.inventory = NodeInventory(
                name=st.cfg.name,
                gpus=tuple(_gpu_info(g) for g in answer.get("gpus", [])),
                cpus=float(answer.get("cpus", 0)),
                mem_gb=float(answer.get("mem_gb", 0.0)),
                probed_at=self._clock.now(),
            )

    async def inventory(self, *, refresh: bool = False) -> list[NodeInventory]:
        """Every node's GPUs; probes nodes whose last probe is older than the interval."""
        now = self._clock.monotonic()
        stale = [
            st
            for st in self._nodes.values()
            if refresh or st.inventory is None or now - st.probed_at >= self.inventory_interval_s
        ]
        await asyncio.gather(*(self._probe(st) for st in stale))
        return [self._inventory_of(st) for st in self._nodes.values()]

    def _inventory_of(self, st: _Node) -> NodeInventory:
        up = not self.node_down(st.cfg.name)
        error = st.probe_error or (st.last_error if st.failures else None)
        if st.inventory is None:
            return NodeInventory(st.cfg.name, (), 0.0, 0.0, up=up and error is None, error=error)
        return replace(st.inventory, up=up, error=error)

    def _gpu_list(self, st: _Node, placement: Placement) -> str:
        """CUDA_VISIBLE_DEVICES: UUIDs (stable across renumbering), indices when unknown."""
        uuids = list(placement.gpu_uuids)
        if len(uuids) != len(placement.gpu_indices) or not all(uuids):
            known = {g.index: g.uuid for g in (st.inventory.gpus if st.inventory else ())}
            uuids = [known.get(i, "") for i in placement.gpu_indices]
        if uuids and all(uuids):
            return ",".join(uuids)
        return ",".join(str(i) for i in placement.gpu_indices)

    async def _stage(self, st: _Node, job_dir: str, files: Sequence[str]) -> None:
        async with self._channel(st, "staging files") as conn:
            try:
                async with conn.start_sftp_client() as sftp:
                    await sftp.makedirs(job_dir, exist_ok=True)
                    for local in files:
                        remote = f"{job_dir}/{os.path.basename(local)}"
                        await sftp.put(local, remote, recurse=os.path.isdir(local))
            except (asyncssh.SFTPError, FileNotFoundError) as exc:
                raise BackendError(f"node {st.cfg.name}: staging {files} failed: {exc}") from None

    async def launch(
        self, job: Job, placement: Placement, *, argv: Sequence[str] | None = None
    ) -> LaunchResult:
        """Start the job detached; ``argv`` overrides ``job.spec.command`` (notebook runners)."""
        st = self._node(placement.node)
        command = list(argv or job.spec.command or [])
        if not command:
            raise BackendError(f"job {job.id} has no command to run on {placement.node}")
        job_dir = self._job_dir(st, job)
        if st.cfg.staging == "sftp" and job.spec.files:
            job_dir = await self._absolute(st, job_dir)
            await self._stage(st, job_dir, job.spec.files)
        args = ["launch", "--job-dir", job_dir, f"--gpus={self._gpu_list(st, placement)}"]
        for key, value in {**job.spec.env, "GPUSCHED_JOB_ID": str(job.id)}.items():
            args += ["--env", f"{key}={value}"]
        if job.spec.workdir:
            args += ["--cwd", job.spec.workdir]
        answer = await self._agent(st, [*args, "--", *command], timeout_s=60.0)
        return _launch_result(placement.node, answer)

    async def claim_launch(self, job: Job, placement: Placement) -> LaunchResult | None:
        """The attempt's launch if it started; else make sure it never starts (None)."""
        st = self._node(placement.node)
        answer = await self._agent(st, ["claim", "--job-dir", self._job_dir(st, job)])
        return _launch_result(placement.node, answer) if answer.get("started") else None

    @staticmethod
    def _job_dir(st: _Node, job: Job) -> str:
        """Unique per job and attempt even across a reset store (ids restart).

        Launching the same job and attempt twice returns the first launch (the agent's
        launch record), so a launch cut short can be repeated safely.
        """
        stamp = job.submitted_at.strftime("%Y%m%dT%H%M%S")
        return f"{st.cfg.workdir.rstrip('/')}/jobs/{job.id}.{job.attempt}-{stamp}"

    def _handle(self, job: Job) -> tuple[_Node, dict[str, Any]]:
        handle = job.handle or {}
        if not handle.get("pid") or not handle.get("node"):
            raise BackendError(f"job {job.id} has no launch record (pid, node) to find it by")
        return self._node(str(handle["node"])), handle

    async def poll(self, job: Job) -> JobStatus:
        """Running, or ended with its exit code; ``lost`` when the node cannot tell.

        Uses :data:`_STATUS_SH` (shell builtins only) rather than the agent's ``status``: the
        same rules at a few ms instead of a Python start-up per running job and poll.
        """
        try:
            st, h = self._handle(job)
            argv = ["sh", "-c", _STATUS_SH, "gpusched-status", h["job_dir"], str(h["pid"])]
            answer = (await self.run(st.cfg.name, argv, timeout_s=30.0, check=True)).stdout
        except BackendError as exc:
            return JobStatus(running=False, lost=True, detail=exc.message)
        kind, _, rest = answer.strip().partition(" ")
        if kind == "exit":
            code, _, ended = rest.partition(" ")
            return JobStatus(
                running=False,
                exit_code=int(code),
                ended_at=datetime.fromisoformat(ended) if ended else None,
            )
        checkpoint, _, rest = rest.partition(" ")
        if _stat_running(rest, h.get("start_time")):
            return JobStatus(running=True, checkpoint_at=_epoch(checkpoint))
        return JobStatus(
            running=False,
            lost=True,
            detail=f"job {job.id}'s process is gone from {st.cfg.name} without an exit "
            "record (killed with SIGKILL, or the node rebooted)",
        )

    async def cancel(self, job: Job, *, grace_s: float = 10.0) -> None:
        """SIGTERM the job's process group, SIGKILL after ``grace_s``."""
        st, h = self._handle(job)
        args = ["kill", "--pgid", str(h["pgid"]), "--grace", str(grace_s)]
        args += ["--job-dir", h["job_dir"]]
        await self._agent(st, args, timeout_s=grace_s + 30.0)

    async def read_log(self, job: Job, *, offset: int = 0, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes of the job's log from ``offset`` (empty before it exists)."""
        st, h = self._handle(job)
        argv = [*st.cfg.agent_argv(), "log", "--file", h["log"], "--offset", str(offset)]
        result = await self.run(
            st.cfg.name, [*argv, "--limit", str(limit)], check=True, encoding=None, timeout_s=60
        )
        return bytes(result.stdout)

    async def follow_log(self, job: Job, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Yield log bytes as they are written, until the job ends (one SSH channel held)."""
        st, h = self._handle(job)
        argv = [*st.cfg.agent_argv(), "log", "--file", h["log"], "--offset", str(offset)]
        argv += ["--follow", "--job-dir", h["job_dir"], "--pid", str(h["pid"])]
        if h.get("start_time") is not None:
            argv += ["--start-time", str(h["start_time"])]
        async with st.streams, self._channel(st, "following a log") as conn:
            process = await conn.create_process(self._command_line(st.cfg, argv), encoding=None)
            try:
                while chunk := await process.stdout.read(65536):
                    yield bytes(chunk)
                await process.wait_closed()
            finally:
                # closing the channel closes the follower's stdin, which makes it exit
                process.close()
            if process.returncode is None:
                # EOF without an exit status: the connection went, not the job
                self._lost(st, conn, "connection lost while following a log")
                raise BackendError(
                    f"node {st.cfg.name}: connection lost while following job {job.id}'s log"
                )
            if process.returncode != 0:
                why = (await process.stderr.read()).decode(errors="replace").strip()[-500:]
                raise BackendError(f"node {st.cfg.name}: following the log failed: {why}")


def _launch_result(node: str, answer: Mapping[str, Any]) -> LaunchResult:
    keys = ("pid", "pgid", "start_time", "job_dir", "log")
    return LaunchResult(handle={"node": node, **{k: answer[k] for k in keys}})


def _gpu_info(g: Mapping[str, Any]) -> GpuInfo:
    return GpuInfo(
        index=int(g["index"]),
        uuid=str(g["uuid"]),
        model=str(g["model"]),
        mem_total_mb=float(g["mem_total_mb"]),
        mem_used_mb=float(g.get("mem_used_mb") or 0.0),
        util_pct=float(g.get("util_pct") or 0.0),
        power_w=None if g.get("power_w") is None else float(g["power_w"]),
        nvlink_peers=tuple(int(i) for i in g.get("nvlink_peers", ())),
        processes=tuple(
            GpuProcess(
                pid=int(p["pid"]),
                used_mem_mb=float(p.get("used_mem_mb") or 0.0),
                name=str(p.get("name") or ""),
                job_id=None if p.get("job_id") is None else int(p["job_id"]),
            )
            for p in g.get("processes", ())
        ),
    )
