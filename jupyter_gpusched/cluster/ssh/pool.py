"""Pooled SSH connections to the nodes: connect with host-key checks, back off, run, forward.

One connection per node as the scheduler's own account, and -- when jobs run as their owners
with per-user keys (``run_as="ssh"``) -- one per (node, owner); :mod:`.owners` says whose
login carries a command and builds its line (``sudo`` mode). Failures to reach a node count
against the node whoever logged in; an owner who cannot log in (no key, no account, sudo says
no) is an :class:`AccountError` of that owner's job, never a fall back to the scheduler's
account.

This package (and the simulator's server side) alone imports asyncssh. Every command line is
built by :func:`shlex.join` from an argument list; host keys are always checked against a
known_hosts file, with no switch that turns checking off.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import asyncssh

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import AccountError, BackendError, HostKeyError
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.core.units import format_duration_s

from ..portforward import Forwarder, ProcessForward
from .config import Forward, NodeConfig, RemoteResult
from .owners import check_user, command_line, login_of, sudo_refused, user_keys

if TYPE_CHECKING:
    from .serving import ServingAgent


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
    users: dict[str, Any] = field(default_factory=dict)  # ssh mode: owner -> connection
    user_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # serving agents (see .serving) by account (None: the scheduler's), least recently used first
    agents: OrderedDict[str | None, ServingAgent] = field(default_factory=OrderedDict)
    agents_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    serving: bool = True  # False once the node's agent turned out not to serve (older install)

    def all_conns(self) -> list[Any]:
        """The scheduler's connection and the owners' (open or not)."""
        return [c for c in (self.conn, *self.users.values()) if c is not None]


_CONNECTION_ERRORS = (OSError, asyncssh.DisconnectError, asyncssh.ConnectionLost, EOFError)


async def open_process(conn: Any, line: str, *, encoding: str | None) -> Any:
    """``conn.create_process(line)`` that leaves no channel behind when cancelled mid-open.

    asyncssh opens a session in steps (open, confirmation, exec request, reply); a cancel
    between them leaves the channel open on both sides and the remote command running, owned
    by nobody, until the connection closes (a dropped log follow's ``agent log --follow``
    outlived its client by the job's whole run). So the open runs to its end whatever happens
    to the caller, and a process that opens after its caller went is closed at once.
    """
    opening = asyncio.ensure_future(conn.create_process(line, encoding=encoding))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[Any]) -> None:
    """Close the process an abandoned :func:`open_process` opened (its error is moot)."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


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
        # A node's max_channels are shared out: long-lived agents keep theirs (see
        # kept_agents), log followers take at most the rest but two, and short commands always
        # find those two.
        self._nodes = {
            n.name: _Node(
                n,
                asyncio.Semaphore(max(1, n.max_channels - self.kept_agents(n))),
                asyncio.Semaphore(max(1, n.max_channels - 2 - self.kept_agents(n))),
            )
            for n in nodes
        }
        self.inventory_interval_s = inventory_interval_s
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.down_after_failures = down_after_failures
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s

    @staticmethod
    def kept_agents(cfg: NodeConfig) -> int:
        """Long-lived agent processes a node keeps, each on a channel of its own (none here)."""
        return 0

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

    def retry_now(self, name: str) -> None:
        """Let the next command try to connect now, whatever the backoff says.

        Before the scheduler declares a node down it asks once more: a node whose network came
        back may still be inside a long backoff.
        """
        self._node(name).retry_at = float("-inf")

    def node_error(self, name: str) -> str | None:
        """The last connection error of a node, None while it answers."""
        st = self._node(name)
        return st.last_error if st.failures else None

    def _failed(self, st: _Node, message: str) -> None:
        st.failures += 1
        st.last_error = message
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (st.failures - 1))
        st.retry_at = self._clock.monotonic() + delay
        for conn in st.all_conns():
            conn.close()
        st.conn = None
        st.users.clear()

    def _lost(self, st: _Node, conn: Any, message: str) -> None:
        """Count a dropped connection once, however many channels were using it."""
        if any(c is conn for c in st.all_conns()):
            self._failed(st, message)

    async def _connect(self, st: _Node, user: str | None = None) -> Any:
        """The open connection for ``user``'s commands (None: the scheduler's own)."""
        login = login_of(st.cfg, user)
        current = st.conn if login is None else st.users.get(login)
        if current is not None and not current.is_closed():
            return current
        lock = st.lock if login is None else st.user_locks.setdefault(login, asyncio.Lock())
        async with lock:
            current = st.conn if login is None else st.users.get(login)
            if current is not None and not current.is_closed():
                return current
            conn = await self._open(st, login)
            if login is None:
                st.conn = conn
            else:
                st.users[login] = conn
            return conn

    def _options(self, st: _Node, login: str | None) -> dict[str, Any]:
        """``asyncssh.connect`` options for ``login`` (None: the scheduler's own), once due."""
        cfg = st.cfg
        wait_s = st.retry_at - self._clock.monotonic()
        if wait_s > 0:
            raise BackendError(
                f"node {cfg.name} is unreachable ({st.last_error}); "
                f"next connection attempt in {format_duration_s(round(wait_s, 1))}"
            )
        known_hosts = cfg.known_hosts_path()
        # The node's error (the cluster view, the log) is the whole message: it says which
        # file and what to do, not only what went wrong.
        if not os.path.isfile(known_hosts):
            message = (
                f"cannot check the host key of node {cfg.name} ({cfg.host}:{cfg.port}): "
                f"known_hosts file {known_hosts} does not exist; create it with the node's "
                f"verified key (ssh-keyscan -p {cfg.port} {cfg.host})"
            )
            self._failed(st, message)
            raise HostKeyError(message)
        options: dict[str, Any] = {
            "port": cfg.port,
            "known_hosts": known_hosts,
            "config": [],  # NodeConfig is the whole truth; ~/.ssh/config cannot weaken it
            "keepalive_interval": self.keepalive_s,
            "keepalive_count_max": 3,
            "connect_timeout": self.connect_timeout_s,
        }
        if login is not None:
            check_user(cfg, login)
            options["username"] = login
            options["client_keys"] = user_keys(cfg, login)
        else:
            if cfg.username:
                options["username"] = cfg.username
            if cfg.client_keys:
                options["client_keys"] = list(cfg.client_keys)
        return options

    async def _open(self, st: _Node, login: str | None) -> Any:
        """A new connection as the scheduler (``login`` None) or as an owner (ssh mode)."""
        cfg = st.cfg
        options = self._options(st, login)
        known_hosts = options["known_hosts"]
        try:
            conn = await asyncssh.connect(cfg.host, **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            message = (
                f"host key of node {cfg.name} ({cfg.host}:{cfg.port}) is not trusted by "
                f"known_hosts file {known_hosts}: {exc.reason}. If the node was reinstalled, "
                "verify its fingerprint and update that file; checking is never disabled."
            )
            self._failed(st, message)
            raise HostKeyError(message) from None
        except asyncssh.PermissionDenied as exc:
            if login is not None:  # this owner's login, not the node, is at fault
                raise AccountError(
                    f"node {cfg.name}: SSH login as {login} failed ({exc.reason}); the "
                    f"node needs an account {login} whose authorized_keys holds the public "
                    f"key of {cfg.key_file_of(login)}"
                ) from None
            user = cfg.username or "the local user"
            message = (
                f"node {cfg.name}: SSH login as {user} failed ({exc.reason}); "
                "check client_keys and the node's authorized_keys"
            )
            self._failed(st, message)
            raise BackendError(message) from None
        except (TimeoutError, *_CONNECTION_ERRORS, asyncssh.Error) as exc:
            reason = str(exc) or type(exc).__name__
            self._failed(st, reason)
            raise BackendError(
                f"node {cfg.name} ({cfg.host}:{cfg.port}) unreachable: {reason}"
            ) from None
        st.failures = 0
        st.last_error = None
        st.retry_at = float("-inf")
        return conn

    @contextlib.asynccontextmanager
    async def _channel(self, st: _Node, what: str, user: str | None = None) -> AsyncIterator[Any]:
        """One channel's worth of a connection for ``user``, with connection errors translated."""
        async with st.channels:
            conn = await self._connect(st, user)
            with self._translated(st, conn, what):
                yield conn

    @contextlib.contextmanager
    def _translated(self, st: _Node, conn: Any, what: str) -> Iterator[None]:
        """Connection errors while ``what`` as :class:`BackendError`; a lost one counted."""
        try:
            yield
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
        conns = [c for st in self._nodes.values() for c in st.all_conns()]
        for st in self._nodes.values():
            for agent in list(st.agents.values()):  # a subclass's (serving.ServingPool)
                agent.close()
            st.conn = None
            st.users.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()

    async def run(
        self,
        node: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout_s: float | None = 60.0,
        check: bool = False,
        input: str | bytes | None = None,
        encoding: str | None = "utf-8",
    ) -> RemoteResult:
        """Run ``argv`` on ``node`` (quoted with :func:`shlex.join`) and wait for it.

        ``user``: run it as that job owner's account (see the node's ``run_as``); None runs
        it as the scheduler's. Raises :class:`BackendError` when the node cannot be reached,
        on timeout, and (with ``check``) on a non-zero exit, quoting the end of stderr;
        :class:`AccountError` when the owner cannot log in or sudo refuses them.
        """
        if input is not None:  # written as a stream: sudo may refuse and exit before reading it
            data = input.encode() if isinstance(input, str) else input
            result = await self.feed(
                node, argv, io.BytesIO(data), user=user, timeout_s=timeout_s or 600.0
            )
            if encoding is not None:
                result = RemoteResult(
                    result.exit_status,
                    result.stdout.decode(encoding, errors="replace"),
                    result.stderr.decode(encoding, errors="replace"),
                )
        else:
            result = await self._run_plain(
                node, argv, user=user, timeout_s=timeout_s, encoding=encoding
            )
        if check and result.exit_status != 0:
            tail = result.stderr[-2000:] if result.stderr else ""
            if isinstance(tail, bytes):
                tail = tail.decode(errors="replace")
            raise BackendError(
                f"node {node}: {argv[0]} exited with {result.exit_status}: {tail.strip()}"
            )
        return result

    async def _run_plain(
        self,
        node: str,
        argv: Sequence[str],
        *,
        user: str | None,
        timeout_s: float | None,
        encoding: str | None,
    ) -> RemoteResult:
        st = self._node(node)
        line = command_line(st.cfg, argv, user)
        async with self._channel(st, f"running {argv[0]}", user) as conn:
            try:
                done = await conn.run(
                    line, timeout=timeout_s, encoding=encoding, stdin=asyncssh.DEVNULL
                )
            except asyncssh.TimeoutError:
                raise BackendError(
                    f"node {node}: {argv[0]} did not finish within "
                    f"{format_duration_s(timeout_s or 0)}"
                ) from None
        code = done.returncode if done.returncode is not None else -1
        sudo_refused(st.cfg, user, done.returncode, done.stderr)
        return RemoteResult(code, done.stdout, done.stderr)

    async def feed(
        self,
        node: str,
        argv: Sequence[str],
        source: IO[bytes],
        *,
        user: str | None = None,
        timeout_s: float = 600.0,
    ) -> RemoteResult:
        """Like :meth:`run` (bytes out), with ``source`` streamed to the command's stdin."""
        st = self._node(node)
        line = command_line(st.cfg, argv, user)
        async with self._channel(st, f"running {argv[0]}", user) as conn:
            try:
                async with asyncio.timeout(timeout_s):
                    process = await open_process(conn, line, encoding=None)
                    try:
                        with contextlib.suppress(BrokenPipeError, asyncssh.Error):
                            while chunk := source.read(1 << 20):
                                process.stdin.write(chunk)
                                await process.stdin.drain()
                            process.stdin.write_eof()
                        out, err = await asyncio.gather(
                            process.stdout.read(), process.stderr.read()
                        )
                        await process.wait_closed()
                    finally:
                        process.close()
            except TimeoutError:
                raise BackendError(
                    f"node {node}: {argv[0]} did not finish within {format_duration_s(timeout_s)}"
                ) from None
        sudo_refused(st.cfg, user, process.returncode, err)
        code = process.returncode if process.returncode is not None else -1
        return RemoteResult(code, out, err)

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

    async def forward_local_ports(
        self,
        node: str,
        targets: Sequence[tuple[str, int, int]],
        *,
        listen_host: str = "127.0.0.1",
    ) -> list[ProcessForward]:
        """Listen on ``listen_host`` and forward each ``(remote_host, remote_port, local_port)``.

        A local port of 0 picks a free one. The forwards run in one child process with its own
        connection (see :mod:`..portforward`): a kernel's traffic costs this loop nothing. They
        die together, with that connection; forward again onto the same local ports.
        """
        st = self._node(node)
        await self._connect(st)  # reachable, and its key trusted: the errors that say why
        options = self._options(st, None)
        return await Forwarder.start(node, st.cfg.host, options, listen_host, list(targets))

    async def forward_local_port_to_path(
        self, node: str, remote_path: str, *, local_port: int = 0
    ) -> Forward:
        """A local port forwarded to a UNIX socket on the node (IPC kernels), in this process."""
        st = self._node(node)
        conn = await self._connect(st)
        try:
            listener = await conn.forward_local_port_to_path("127.0.0.1", local_port, remote_path)
        except OSError as exc:
            raise BackendError(
                f"node {node}: cannot listen on 127.0.0.1:{local_port}: {exc}"
            ) from None
        return Forward(node, listener, remote_path, 0)
