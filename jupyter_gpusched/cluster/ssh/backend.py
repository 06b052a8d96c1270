"""SSH backend: GPU nodes reached over pooled asyncssh connections.

Everything remote goes through the node agent
(:mod:`jupyter_gpusched.node.agent`), started with a command line built by :func:`shlex.join`
from an argument list, so no user string is ever pasted into a shell line. Host keys are always
checked against a known_hosts file; there is no switch that turns checking off.

Everything a job does on its node -- staging, launch, status, kill, logs, claims, its lease
kernel's connection file, its notebook's outputs -- runs as the job's owner when the node's
``run_as`` says so (see :mod:`.pool`); probes run as the scheduler's own account.

Failure model: every failed attempt to talk to a node (connect refused or timed out, connection
lost mid-command) counts as one consecutive failure; the next connect waits an exponential
backoff on the injected clock; ``down_after_failures`` failures in a row mark the node down. One
successful connect resets both.
"""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from jupyter_gpusched.core.errors import BackendError, NodeRefusedError
from jupyter_gpusched.core.inventory import GpuInfo, GpuProcess, NodeInventory
from jupyter_gpusched.core.models import Job, Placement
from jupyter_gpusched.node.agent import SERVED

from ..base import JobStatus, LaunchResult
from .owners import command_line, sudo_refused
from .pool import _Node, open_process
from .serving import ServingPool

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


#: Seconds between reads of a log followed by polling (the node's follow channels are taken).
LOG_POLL_S = 0.5


def _stat_running(stat: str, start_time: int | None) -> bool:
    """Alive, not a zombie, and the same process (start time, /proc field 22) as launched."""
    if ")" not in stat:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return False
    return start_time is None or int(fields[19]) == int(start_time)


def _gone(job: Job, node: str) -> JobStatus:
    """The node answered, and the job's process is gone without leaving an exit record."""
    return JobStatus(
        running=False,
        lost=True,
        gone=True,
        detail=f"job {job.id}'s process is gone from {node} without an exit record "
        "(killed with SIGKILL, or the node rebooted)",
    )


def _epoch(text: str) -> datetime | None:
    """A reported checkpoint time (Unix seconds), None when absent or garbled."""
    try:
        return datetime.fromtimestamp(float(text), tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


class SshBackend(ServingPool):
    """A :class:`~jupyter_gpusched.cluster.base.Backend` on the node pool's SSH connections."""

    async def _agent(
        self,
        st: _Node,
        args: Sequence[str],
        *,
        user: str | None = None,
        timeout_s: float = 60.0,
        input: str | None = None,
        stdin: Any = None,
    ) -> dict[str, Any]:
        """One agent subcommand's JSON answer, run as ``user`` (None: the scheduler)."""
        argv = [*st.cfg.agent_argv(), *args]
        if stdin is None and args[0] in SERVED:
            result = await self.ask(st.cfg.name, args, user=user, timeout_s=timeout_s, input=input)
        elif stdin is None:
            result = await self.run(st.cfg.name, argv, user=user, timeout_s=timeout_s, input=input)
        else:
            result = await self.feed(st.cfg.name, argv, stdin, user=user, timeout_s=timeout_s)
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

    async def _stage(self, st: _Node, job: Job, job_dir: str, files: Sequence[str]) -> str:
        """Copy ``files`` into the job dir as its owner, as one tar stream; the absolute dir.

        The agent writes them (0700 dir, owner's permission bits), so the copies belong to the
        job's owner and nobody else can read them, whoever the scheduler logged in as.
        """
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as spool:
            try:
                await asyncio.to_thread(_tar, files, spool)
            except OSError as exc:
                raise NodeRefusedError(f"staging {files} failed: {exc}") from None
            spool.seek(0)
            answer = await self._agent(
                st, ["stage", "--job-dir", job_dir], user=job.user, timeout_s=600.0, stdin=spool
            )
        return str(answer["job_dir"])

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
            job_dir = await self._stage(st, job, job_dir, job.spec.files)
        args = ["launch", "--job-dir", job_dir, f"--gpus={self._gpu_list(st, placement)}"]
        if job.spec.workdir:
            args += ["--cwd", job.spec.workdir]
        # The command, environment and parameters go on stdin, not the exec line: one big
        # argument there overflows an SSH packet and drops the connection every user of the
        # node shares, and every user of the node reads command lines (ps). The agent hands
        # the env to the job's process (whose environ only its owner reads) and writes the
        # parameters to a 0600 file in the job dir.
        env = {**job.spec.env, "GPUSCHED_JOB_ID": str(job.id)}
        launch_spec: dict[str, Any] = {"argv": command, "env": env}
        if job.spec.parameters:
            launch_spec["parameters"] = job.spec.parameters
        spec = json.dumps(launch_spec)
        answer = await self._agent(
            st, [*args, "--spec", "-"], user=job.user, timeout_s=60.0, input=spec
        )
        return _launch_result(placement.node, answer)

    async def claim_launch(self, job: Job, placement: Placement) -> LaunchResult | None:
        """The attempt's launch if it started; else make sure it never starts (None)."""
        st = self._node(placement.node)
        answer = await self._agent(
            st, ["claim", "--job-dir", self._job_dir(st, job)], user=job.user
        )
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
        same rules at a few ms instead of a Python start-up per running job and poll -- except
        in sudo mode, where only the agent may run as the job's owner.
        """
        try:
            st, h = self._handle(job)
            if st.cfg.run_as == "sudo":
                return await self._agent_status(st, job, h)
            argv = ["sh", "-c", _STATUS_SH, "gpusched-status", h["job_dir"], str(h["pid"])]
            result = await self.run(st.cfg.name, argv, user=job.user, timeout_s=30.0, check=True)
            answer = result.stdout
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
        return _gone(job, st.cfg.name)

    async def _agent_status(self, st: _Node, job: Job, h: Mapping[str, Any]) -> JobStatus:
        """:meth:`poll` through the agent's ``status`` (the rules of :data:`_STATUS_SH`)."""
        args = ["status", "--job-dir", h["job_dir"], "--pid", str(h["pid"])]
        if h.get("start_time") is not None:
            args += ["--start-time", str(h["start_time"])]
        answer = await self._agent(st, args, user=job.user, timeout_s=30.0)
        if answer.get("running"):
            return JobStatus(running=True, checkpoint_at=_epoch(answer.get("checkpoint") or ""))
        if answer.get("exit_code") is not None:
            ended = answer.get("ended_at")
            return JobStatus(
                running=False,
                exit_code=int(answer["exit_code"]),
                ended_at=datetime.fromisoformat(ended) if ended else None,
            )
        return _gone(job, st.cfg.name)

    async def cancel(self, job: Job, *, grace_s: float = 10.0) -> None:
        """SIGTERM the job's process group, SIGKILL after ``grace_s``."""
        st, h = self._handle(job)
        args = ["kill", "--pgid", str(h["pgid"]), "--grace", str(grace_s)]
        args += ["--job-dir", h["job_dir"]]
        await self._agent(st, args, user=job.user, timeout_s=grace_s + 30.0)

    async def read_log(self, job: Job, *, offset: int = 0, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes of the job's log from ``offset`` (empty before it exists)."""
        st, h = self._handle(job)
        return await self._read(st, job, h["log"], offset=offset, limit=limit)

    async def _read(
        self, st: _Node, job: Job, path: str, *, offset: int = 0, limit: int | None = None
    ) -> bytes:
        """Bytes of a file of the job on its node, read as the job's owner."""
        argv = [*st.cfg.agent_argv(), "log", "--file", path, "--offset", str(offset)]
        if limit is not None:
            argv += ["--limit", str(limit)]
        result = await self.run(
            st.cfg.name, argv, user=job.user, check=True, encoding=None, timeout_s=300
        )
        return bytes(result.stdout)

    async def fetch_file(self, job: Job, remote: str, local: str) -> None:
        """Copy a file of the job's (its executed notebook) to ``local``, read as its owner."""
        st, _ = self._handle(job)
        data = await self._read(st, job, remote)
        await asyncio.to_thread(_write_file, local, data)

    async def kernel_connection(self, job: Job, path: str, *, timeout_s: float) -> dict[str, Any]:
        """A lease kernel's connection info once its file is complete, read as its owner."""
        st, _ = self._handle(job)
        args = ["connection", "--path", path, "--timeout", str(timeout_s)]
        return await self._agent(st, args, user=job.user, timeout_s=timeout_s + 30.0)

    async def remove_file(self, job: Job, path: str) -> None:
        """Remove a file of the job's (a lease kernel's connection file), as its owner."""
        st, _ = self._handle(job)
        await self._agent(st, ["remove", "--path", path], user=job.user, timeout_s=30.0)

    async def follow_log(self, job: Job, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Yield log bytes as they are written, until the job ends (one SSH channel held).

        When the node's channels for follows are all taken (by other users' follows), the
        log is read by polling instead: a follow never waits for another one to end.
        """
        st, h = self._handle(job)
        if st.streams.locked():
            async for chunk in self._poll_log(job, offset):
                yield chunk
            return
        argv = [*st.cfg.agent_argv(), "log", "--file", h["log"], "--offset", str(offset)]
        argv += ["--follow", "--job-dir", h["job_dir"], "--pid", str(h["pid"])]
        if h.get("start_time") is not None:
            argv += ["--start-time", str(h["start_time"])]
        line = command_line(st.cfg, argv, job.user)
        async with st.streams, self._channel(st, "following a log", job.user) as conn:
            process = await open_process(conn, line, encoding=None)
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
                err = await process.stderr.read()
                sudo_refused(st.cfg, job.user, process.returncode, err)
                why = err.decode(errors="replace").strip()[-500:]
                raise BackendError(f"node {st.cfg.name}: following the log failed: {why}")

    async def _poll_log(self, job: Job, offset: int) -> AsyncIterator[bytes]:
        """Follow a log by reading it every ``LOG_POLL_S`` until the job ends."""
        while True:
            status = await self.poll(job)  # before the read: what it saw ended is all there
            if status.lost:
                raise BackendError(status.detail or f"job {job.id}'s node cannot be reached")
            data = await self.read_log(job, offset=offset, limit=1 << 20)
            if data:
                offset += len(data)
                yield data
            elif not status.running:
                return
            else:
                await asyncio.sleep(LOG_POLL_S)


def _tar(files: Sequence[str], out: Any) -> None:
    """``files`` (files or directories, links followed) as a tar stream into ``out``."""
    with tarfile.open(fileobj=out, mode="w|", dereference=True) as tar:
        for local in files:
            tar.add(local, arcname=os.path.basename(os.path.normpath(local)), recursive=True)


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


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
                user=p.get("user"),
            )
            for p in g.get("processes", ())
        ),
    )
