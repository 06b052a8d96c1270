"""One pooled SSH connection per node: connect with host-key checks, back off, run, copy, forward.

This package (and the simulator's server side) alone imports asyncssh. Every command line is
built by :func:`shlex.join` from an argument list; host keys are always checked against a
known_hosts file, with no switch that turns checking off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import BackendError, HostKeyError
from jupyter_gpusched.core.units import format_duration_s

from ..base import NodeInventory
from .config import Forward, NodeConfig, RemoteResult


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


_CONNECTION_ERRORS = (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost, EOFError)


class NodePool:
    """SSH connections to the configured nodes, one each, reopened with backoff when lost."""

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
                    f"next connection attempt in {format_duration_s(round(wait_s, 1))}"
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
                    f"node {node}: {argv[0]} did not finish within "
                    f"{format_duration_s(timeout_s or 0)}"
                ) from None
        code = done.returncode if done.returncode is not None else -1
        result = RemoteResult(code, done.stdout, done.stderr)
        if check and code != 0:
            tail = result.stderr[-2000:] if result.stderr else ""
            if isinstance(tail, bytes):
                tail = tail.decode(errors="replace")
            raise BackendError(f"node {node}: {argv[0]} exited with {code}: {tail.strip()}")
        return result

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
        self,
        node: str,
        remote_host: str,
        remote_port: int,
        *,
        local_port: int = 0,
        listen_host: str = "127.0.0.1",
    ) -> Forward:
        """Listen on ``listen_host``:``local_port`` (0 = any) and forward to the node's side.

        Forwards die with their connection; after a reconnect, forward again onto the same
        local ports.
        """
        st = self._node(node)
        conn = await self._connect(st)
        try:
            listener = await conn.forward_local_port(
                listen_host, local_port, remote_host, remote_port
            )
        except OSError as exc:
            raise BackendError(
                f"node {node}: cannot listen on {listen_host}:{local_port}: {exc}"
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
