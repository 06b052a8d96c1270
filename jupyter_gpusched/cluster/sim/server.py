"""The SSH side of a simulated node: asyncssh server callbacks and real local processes.

Each command a client sends runs as a local process in its own session (like sshd), with its
stdin, stdout and stderr pumped over the channel and SSH signals relayed to its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from .specs import SimNodeSpec

_CHUNK = 65536


@dataclass
class _Node:
    """Runtime of one simulated node."""

    spec: SimNodeSpec
    dir: Path
    host_key: asyncssh.SSHKey
    port: int = 0
    listener: asyncssh.SSHAcceptor | None = None
    conns: set[asyncssh.SSHServerConnection] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def state_path(self) -> Path:
        return self.dir / "gpus.json"

    @property
    def home(self) -> Path:
        return self.dir / "home"


class _NodeServer(asyncssh.SSHServer):
    """Per-connection server: tracks connections and allows port forwarding (remote kernels)."""

    def __init__(self, node: _Node) -> None:
        self._node = node
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._node.conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._node.conns.discard(self._conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        """Allow ``forward_local_port`` (asyncssh refuses it unless told otherwise)."""
        return True

    def unix_connection_requested(self, dest_path: str) -> bool:
        """Allow ``forward_local_port_to_path`` (kernels on IPC sockets)."""
        return True


class _NodeSftp(asyncssh.SFTPServer):
    """SFTP confined to the node's directory; relative paths start in the node's $HOME, as sshd."""

    def __init__(self, chan: asyncssh.SSHServerChannel, *, root: Path, home: Path) -> None:
        super().__init__(chan)
        self._root = os.fsencode(os.path.realpath(root))
        self._home = os.fsencode(home)

    def map_path(self, path: bytes) -> bytes:
        """Resolve against $HOME and refuse anything outside the node's directory."""
        full = os.path.normpath(os.path.join(self._home, path))
        real = os.path.realpath(full)  # checked through symlinks; operated on as named
        if real != self._root and not real.startswith(self._root + b"/"):
            raise asyncssh.SFTPPermissionDenied("outside this simulated node's directory")
        return full


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _relay_signals(process: asyncssh.SSHServerProcess[bytes], pgid: int) -> None:
    """Deliver SSH signal/break requests to the command's process group, as sshd does.

    asyncssh queues them on stdin, where nobody reads after the client's EOF; taking them as
    they arrive works whether or not stdin is still open.
    """

    def on_signal(name: str) -> None:
        sig = getattr(signal, f"SIG{name}", None)
        if isinstance(sig, signal.Signals):
            _signal_group(pgid, sig)

    def on_break(msec: int) -> bool:
        _signal_group(pgid, signal.SIGINT)
        return True

    process.signal_received = on_signal  # type: ignore[method-assign,assignment]
    process.break_received = on_break  # type: ignore[method-assign]


async def _pump_stdin(
    process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
) -> None:
    """Client -> command stdin with backpressure (and signals queued before the command ran)."""
    assert proc.stdin is not None
    try:
        while True:
            try:
                data = await process.stdin.read(_CHUNK)
            except asyncssh.SignalReceived as exc:
                sig = getattr(signal, f"SIG{exc.signal}", None)
                if isinstance(sig, signal.Signals):
                    _signal_group(proc.pid, sig)
                continue
            except asyncssh.BreakReceived:
                _signal_group(proc.pid, signal.SIGINT)
                continue
            except asyncssh.TerminalSizeChanged:
                continue
            if not data:
                break
            proc.stdin.write(data)
            await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
        pass  # the command stopped reading, or the channel went away
    finally:
        proc.stdin.close()


async def _pump_out(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    """Command stdout/stderr -> channel; keeps draining the pipe if the channel is gone."""
    broken = False
    while data := await source.read(_CHUNK):
        if broken:
            continue
        try:
            sink.write(data)
            await sink.drain()
        except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
            broken = True
