"""SSH backend: GPU nodes reached over one pooled asyncssh connection each.

The only module that imports asyncssh. Everything remote goes through the node agent
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
import contextlib
import json
import os
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import asyncssh

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import BackendError, HostKeyError
from jupyter_gpusched.core.models import Job, Placement

from .base import GpuInfo, GpuProcess, JobStatus, LaunchResult, NodeInventory


@dataclass(frozen=True)
class NodeConfig:
    """How to reach one GPU node and run the agent there."""

    name: str  # the node's name in the scheduler (placements name it)
    host: str
    port: int = 22
    username: str | None = None  # None: the local user's name
    client_keys: tuple[str, ...] = ()  # private key files; empty: ~/.ssh defaults and the agent
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts; checking is never switched off
    python: str = "python3"  # interpreter on the node that can import jupyter_gpusched
    agent_cmd: tuple[str, ...] | None = (
        None  # default: (python, "-m", "jupyter_gpusched.node.agent")
    )
    workdir: str = "~/.gpusched"  # per-job dirs live under <workdir>/jobs on the node
    staging: Literal["sftp", "shared"] = "sftp"  # shared: the node sees the same filesystem
    max_channels: int = 8  # concurrent SSH channels (OpenSSH's MaxSessions defaults to 10)
    env: Mapping[str, str] = field(default_factory=dict)  # set for every remote command

    def __post_init__(self) -> None:
        if self.staging not in ("sftp", "shared"):
            raise ValueError(
                f"node {self.name}: staging must be 'sftp' or 'shared', not {self.staging!r}"
            )
        if self.max_channels < 1:
            raise ValueError(
                f"node {self.name}: max_channels must be >= 1, not {self.max_channels}"
            )

    def agent_argv(self) -> tuple[str, ...]:
        """The argv prefix that runs the agent on this node."""
        return self.agent_cmd or (self.python, "-m", "jupyter_gpusched.node.agent")

    def known_hosts_path(self) -> str:
        """The known_hosts file host keys are checked against."""
        return os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts")


class RemoteResult(NamedTuple):
    """A finished remote command, shaped like :class:`subprocess.CompletedProcess`."""

    exit_status: int  # negative when killed by a signal
    stdout: Any  # str, or bytes when run with encoding=None
    stderr: Any


class Forward:
    """A local TCP port forwarded over a node's SSH connection (for remote kernels).

    ``remote_host`` is the socket path and ``remote_port`` 0 for a forward to a UNIX socket.
    """

    def __init__(self, node: str, listener: Any, remote_host: str, remote_port: int) -> None:
        self.node = node
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.local_port: int = listener.get_port()
        self._listener = listener

    def close(self) -> None:
        """Stop listening; open forwarded connections close with the SSH connection."""
        self._listener.close()

    async def wait_closed(self) -> None:
        """Wait until the listener is shut down."""
        await self._listener.wait_closed()


@dataclass
class _Node:
    cfg: NodeConfig
    channels: asyncio.Semaphore
    streams: asyncio.Semaphore  # long-lived log followers; leaves room for short commands
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    probe_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: Any = None
    failures: int = 0
    retry_at: float = float("-inf")
    last_error: str | None = None
    home: str | None = None
    inventory: NodeInventory | None = None
    probed_at: float = float("-inf")  # clock.monotonic() of the last probe attempt
    probe_error: str | None = None
    probes: int = 0  # probes started, so concurrent inventory() calls share one


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


_CONNECTION_ERRORS = (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost, EOFError)


class SshBackend:
    """A :class:`~jupyter_gpusched.cluster.base.Backend` over SSH, one pooled connection a node."""

    def __init__(
        self,
        nodes: Sequence[NodeConfig],
        *,
        clock: Clock,
        inventory_interval_s: float = 30.0,
        keepalive_s: float = 15.0,
        connect_timeout_s: float = 10.0,
        down_after_failures: int = 3,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique, got {names}")
        self._clock = clock
        self._nodes = {
            n.name: _Node(
                n,
                asyncio.Semaphore(max(1, n.max_channels)),
                asyncio.Semaphore(max(1, n.max_channels - 2)),
            )
            for n in nodes
        }
        self.inventory_interval_s = inventory_interval_s
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.down_after_failures = down_after_failures
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s

    # ------------------------------------------------------------------ connections

    @property
    def node_names(self) -> list[str]:
        """Configured node names, in configuration order."""
        return list(self._nodes)

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise BackendError(f"unknown node {name!r}; configured: {list(self._nodes)}") from None

    def node_config(self, name: str) -> NodeConfig:
        """How a node is reached (host, user, its Python, its work dir)."""
        return self._node(name).cfg

    def node_down(self, name: str) -> bool:
        """True after ``down_after_failures`` consecutive failed attempts to reach the node."""
        return self._node(name).failures >= self.down_after_failures

    def node_error(self, name: str) -> str | None:
        """The last connection error of a node, None while it answers."""
        st = self._node(name)
        return st.last_error if st.failures else None

    def _failed(self, st: _Node, message: str) -> None:
        st.failures += 1
        st.last_error = message
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (st.failures - 1))
        st.retry_at = self._clock.monotonic() + delay
        if st.conn is not None:
            st.conn.close()
            st.conn = None

    def _lost(self, st: _Node, conn: Any, message: str) -> None:
        """Count a dropped connection once, however many channels were using it."""
        if st.conn is conn:
            self._failed(st, message)

    async def _connect(self, st: _Node) -> Any:
        if st.conn is not None and not st.conn.is_closed():
            return st.conn
        async with st.lock:
            if st.conn is not None and not st.conn.is_closed():
                return st.conn
            st.conn = None
            cfg = st.cfg
            wait_s = st.retry_at - self._clock.monotonic()
            if wait_s > 0:
                raise BackendError(
                    f"node {cfg.name} is unreachable ({st.last_error}); "
                    f"next connection attempt in {wait_s:.1f} s"
                )
            known_hosts = cfg.known_hosts_path()
            if not os.path.isfile(known_hosts):
                self._failed(st, f"no known_hosts file {known_hosts}")
                raise HostKeyError(
                    f"cannot check the host key of node {cfg.name} ({cfg.host}:{cfg.port}): "
                    f"known_hosts file {known_hosts} does not exist; create it with the node's "
                    f"verified key (ssh-keyscan -p {cfg.port} {cfg.host})"
                )
            options: dict[str, Any] = {
                "port": cfg.port,
                "known_hosts": known_hosts,
                "config": [],  # NodeConfig is the whole truth; ~/.ssh/config cannot weaken it
                "keepalive_interval": self.keepalive_s,
                "keepalive_count_max": 3,
                "connect_timeout": self.connect_timeout_s,
            }
            if cfg.username:
                options["username"] = cfg.username
            if cfg.client_keys:
                options["client_keys"] = list(cfg.client_keys)
            try:
                st.conn = await asyncssh.connect(cfg.host, **options)
            except asyncssh.HostKeyNotVerifiable as exc:
                self._failed(st, f"host key not trusted: {exc.reason}")
                raise HostKeyError(
                    f"host key of node {cfg.name} ({cfg.host}:{cfg.port}) is not trusted by "
                    f"known_hosts file {known_hosts}: {exc.reason}. If the node was reinstalled, "
                    "verify its fingerprint and update that file; checking is never disabled."
                ) from None
            except asyncssh.PermissionDenied as exc:
                self._failed(st, f"authentication failed: {exc.reason}")
                user = cfg.username or "the local user"
                raise BackendError(
                    f"node {cfg.name}: SSH login as {user} failed ({exc.reason}); "
                    "check client_keys and the node's authorized_keys"
                ) from None
            except (TimeoutError, *_CONNECTION_ERRORS, asyncssh.Error) as exc:
                reason = str(exc) or type(exc).__name__
                self._failed(st, reason)
                raise BackendError(
                    f"node {cfg.name} ({cfg.host}:{cfg.port}) unreachable: {reason}"
                ) from None
            st.failures = 0
            st.last_error = None
            st.retry_at = float("-inf")
            return st.conn

    @contextlib.asynccontextmanager
    async def _channel(self, st: _Node, what: str) -> AsyncIterator[Any]:
        """One channel's worth of the node's connection, with connection errors translated."""
        async with st.channels:
            conn = await self._connect(st)
            try:
                yield conn
            except asyncssh.ChannelOpenError as exc:
                # a session channel fails to open with CONNECT_FAILED once the transport is
                # gone, which can be before the connection reports itself closed
                if exc.code == asyncssh.OPEN_CONNECT_FAILED or conn.is_closed():
                    self._lost(st, conn, f"connection lost: {exc.reason}")
                raise BackendError(f"node {st.cfg.name}: {what}: {exc.reason}") from None
            except _CONNECTION_ERRORS as exc:
                if isinstance(exc, OSError) and not conn.is_closed():
                    raise BackendError(f"node {st.cfg.name}: {what}: {exc}") from None
                reason = str(exc) or type(exc).__name__
                self._lost(st, conn, f"connection lost: {reason}")
                raise BackendError(
                    f"node {st.cfg.name}: connection lost during {what}: {reason}"
                ) from None

    async def start(self) -> None:
        """Connect to every node now (failures are recorded, not raised). Idempotent."""

        async def attempt(st: _Node) -> None:
            with contextlib.suppress(BackendError):
                await self._connect(st)

        await asyncio.gather(*(attempt(st) for st in self._nodes.values()))

    async def close(self) -> None:
        """Close the connections; jobs keep running on their nodes."""
        conns = [st.conn for st in self._nodes.values() if st.conn is not None]
        for st in self._nodes.values():
            st.conn = None
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()

    # ------------------------------------------------------------------ commands

    @staticmethod
    def _command_line(cfg: NodeConfig, argv: Sequence[str]) -> str:
        env = [f"{k}={v}" for k, v in cfg.env.items()]
        return shlex.join(["env", *env, *argv] if env else list(argv))

    async def run(
        self,
        node: str,
        argv: Sequence[str],
        *,
        timeout_s: float | None = 60.0,
        check: bool = False,
        input: str | bytes | None = None,
        encoding: str | None = "utf-8",
    ) -> RemoteResult:
        """Run ``argv`` on ``node`` (quoted with :func:`shlex.join`) and wait for it.

        Raises :class:`BackendError` when the node cannot be reached, on timeout, and (with
        ``check``) on a non-zero exit, quoting the end of stderr.
        """
        st = self._node(node)
        line = self._command_line(st.cfg, argv)
        async with self._channel(st, f"running {argv[0]}") as conn:
            stdin = {"input": input} if input is not None else {"stdin": asyncssh.DEVNULL}
            try:
                done = await conn.run(line, timeout=timeout_s, encoding=encoding, **stdin)
            except asyncssh.TimeoutError:
                raise BackendError(
                    f"node {node}: {argv[0]} did not finish within {timeout_s} s"
                ) from None
        code = done.returncode if done.returncode is not None else -1
        result = RemoteResult(code, done.stdout, done.stderr)
        if check and code != 0:
            tail = result.stderr[-2000:] if result.stderr else ""
            if isinstance(tail, bytes):
                tail = tail.decode(errors="replace")
            raise BackendError(f"node {node}: {argv[0]} exited with {code}: {tail.strip()}")
        return result

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
            why = (answer or {}).get("error") if isinstance(answer, dict) else None
            why = why or (result.stderr or result.stdout or "").strip()[-1000:]
            raise BackendError(
                f"node {st.cfg.name}: agent {args[0]} failed (exit {result.exit_status}): {why}; "
                f"is jupyter_gpusched importable by {' '.join(st.cfg.agent_argv())!r} there?"
            )
        return answer

    async def _home(self, st: _Node) -> str:
        if st.home is None:
            result = await self.run(st.cfg.name, ["printenv", "HOME"], check=True, timeout_s=30)
            st.home = result.stdout.strip() or "/"
        return st.home

    async def _absolute(self, st: _Node, path: str) -> str:
        """A remote path with ``~`` expanded (SFTP does not expand it)."""
        if path == "~" or path.startswith("~/"):
            return (await self._home(st)).rstrip("/") + path[1:]
        return path

    # ------------------------------------------------------------------ inventory

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

    # ------------------------------------------------------------------ jobs

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
        # Unique per job and attempt even across a reset store (ids restart); launching the
        # same job and attempt twice returns the first launch (the agent's launch record).
        stamp = job.submitted_at.strftime("%Y%m%dT%H%M%S")
        job_dir = f"{st.cfg.workdir.rstrip('/')}/jobs/{job.id}.{job.attempt}-{stamp}"
        if st.cfg.staging == "sftp" and job.spec.files:
            job_dir = await self._absolute(st, job_dir)
            await self._stage(st, job_dir, job.spec.files)
        args = ["launch", "--job-dir", job_dir, f"--gpus={self._gpu_list(st, placement)}"]
        for key, value in {**job.spec.env, "GPUSCHED_JOB_ID": str(job.id)}.items():
            args += ["--env", f"{key}={value}"]
        if job.spec.workdir:
            args += ["--cwd", job.spec.workdir]
        answer = await self._agent(st, [*args, "--", *command], timeout_s=60.0)
        return LaunchResult(
            handle={
                "node": placement.node,
                "pid": answer["pid"],
                "pgid": answer["pgid"],
                "start_time": answer["start_time"],
                "job_dir": answer["job_dir"],
                "log": answer["log"],
            }
        )

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

    # ------------------------------------------------------------------ files and ports

    async def put_file(self, node: str, local: str, remote: str) -> None:
        """Upload one file by SFTP, creating the remote parent directory."""
        st = self._node(node)
        remote = await self._absolute(st, remote)
        async with self._channel(st, "uploading a file") as conn:
            try:
                async with conn.start_sftp_client() as sftp:
                    parent = os.path.dirname(remote)
                    if parent:
                        await sftp.makedirs(parent, exist_ok=True)
                    await sftp.put(local, remote)
            except (asyncssh.SFTPError, FileNotFoundError) as exc:
                raise BackendError(f"node {node}: upload {local} -> {remote}: {exc}") from None

    async def get_file(self, node: str, remote: str, local: str) -> None:
        """Download one file by SFTP."""
        st = self._node(node)
        remote = await self._absolute(st, remote)
        async with self._channel(st, "downloading a file") as conn:
            try:
                async with conn.start_sftp_client() as sftp:
                    await sftp.get(remote, local)
            except (asyncssh.SFTPError, FileNotFoundError) as exc:
                raise BackendError(f"node {node}: download {remote} -> {local}: {exc}") from None

    async def forward_local_port(
        self, node: str, remote_host: str, remote_port: int, *, local_port: int = 0
    ) -> Forward:
        """Listen on 127.0.0.1:``local_port`` (0 = any) and forward to the node's side.

        Forwards die with their connection; after a reconnect, forward again onto the same
        local ports.
        """
        st = self._node(node)
        conn = await self._connect(st)
        try:
            listener = await conn.forward_local_port(
                "127.0.0.1", local_port, remote_host, remote_port
            )
        except OSError as exc:
            raise BackendError(
                f"node {node}: cannot listen on 127.0.0.1:{local_port}: {exc}"
            ) from None
        return Forward(node, listener, remote_host, remote_port)

    async def forward_local_port_to_path(
        self, node: str, remote_path: str, *, local_port: int = 0
    ) -> Forward:
        """Like :meth:`forward_local_port`, to a UNIX socket on the node (IPC kernels)."""
        st = self._node(node)
        conn = await self._connect(st)
        try:
            listener = await conn.forward_local_port_to_path("127.0.0.1", local_port, remote_path)
        except OSError as exc:
            raise BackendError(
                f"node {node}: cannot listen on 127.0.0.1:{local_port}: {exc}"
            ) from None
        return Forward(node, listener, remote_path, 0)


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
