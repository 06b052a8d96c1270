"""The service's side of a Slurm cluster: local commands, shared files, kernel port relays.

With Slurm the service runs on a submit host that shares a filesystem with the nodes (job dirs
in home directories, as Slurm sites have them), so files are read and written here, as the
job's owner through ``sudo -n -u`` where the service's own user may not. Lease kernels are
reached at the node's address through :class:`Relay` (or over SSH, see the backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_gpusched.core.errors import BackendError
from jupyter_gpusched.core.units import format_duration_s
from jupyter_gpusched.node.stage import private_folder

from ..ssh.config import RemoteResult
from .commands import as_user


async def run_local(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = 60.0,
    input: str | bytes | None = None,
    encoding: str | None = "utf-8",
) -> RemoteResult:
    """Run ``argv`` here (no shell) and wait; shaped like :meth:`NodePool.run`."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise BackendError(f"cannot run {argv[0]}: {exc}") from None
    data = input.encode() if isinstance(input, str) else input
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise BackendError(
            f"{argv[0]} did not finish within {format_duration_s(timeout_s or 0)}"
        ) from None
    if encoding is not None:
        return RemoteResult(
            proc.returncode or 0,
            out.decode(encoding, errors="replace"),
            err.decode(encoding, errors="replace"),
        )
    return RemoteResult(proc.returncode or 0, out, err.decode(errors="replace"))


class SharedFiles:
    """Files on the shared filesystem, read and written as their owner when that is needed."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    async def _as(self, user: str | None, argv: Sequence[str], what: str, **kw: Any) -> Any:
        result = await run_local(as_user(user, argv), env=self.env, **kw)
        if result.exit_status != 0:
            why = str(result.stderr).strip()[-500:]
            raise BackendError(f"{what} as {user or 'the service user'} failed: {why}")
        return result.stdout

    async def makedirs(self, user: str | None, path: str) -> None:
        """Create a private directory owned by ``user``; the parents it makes are 0700 too."""
        if user is None:
            private_folder(path)
            os.chmod(path, 0o700)
            return
        # mkdir -p gives the parents it makes the umask's mode; naming each one gives it -m
        parts = path.rstrip("/").split("/")
        chain = ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]
        await self._as(user, ["mkdir", "-p", "-m", "0700", "--", *chain], f"creating {path}")

    async def write(self, user: str | None, path: str, text: str) -> None:
        """Write ``text`` to ``path`` as ``user`` (mind: in a private dir; as the service, 0600).

        As another user it goes through ``dd`` (on the sudoers line already), whose file mode
        is sudo's umask's: the file is private by the 0700 job dir it is written into.
        """
        if user is None:
            tmp = f"{path}.tmp{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
            return
        argv = ["dd", f"of={path}", "status=none"]
        await self._as(user, argv, f"writing {path}", input=text)

    async def copy_in(self, user: str | None, sources: Sequence[str], target_dir: str) -> None:
        """Copy local files (or directories) into ``target_dir``, as ``user``."""
        if user is None:
            for src in sources:
                dest = os.path.join(target_dir, os.path.basename(src.rstrip("/")))
                try:
                    if os.path.isdir(src):
                        shutil.copytree(src, dest, dirs_exist_ok=True)
                    else:
                        shutil.copy2(src, dest)
                except OSError as exc:
                    raise BackendError(f"staging {src} into {target_dir} failed: {exc}") from None
            return
        argv = ["cp", "-R", "--", *sources, target_dir]
        await self._as(user, argv, f"staging {list(sources)} into {target_dir}")

    async def read(self, user: str | None, path: str, offset: int = 0, limit: int = -1) -> bytes:
        """Bytes of ``path`` from ``offset`` (< 0: from the end; ``limit`` < 0: to the end).

        b'' when absent.
        """
        try:
            with open(path, "rb") as f:
                if offset < 0:
                    offset = max(0, f.seek(0, os.SEEK_END) + offset)
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""
        except PermissionError:
            if user is None:
                raise BackendError(f"cannot read {path}: permission denied") from None
        argv = ["dd", f"if={path}", "iflag=skip_bytes,count_bytes", f"skip={offset}"]
        if limit >= 0:
            argv.append(f"count={limit}")
        argv.append("status=none")
        if offset < 0:  # the last bytes (at most as many as the offset says)
            argv = ["tail", "-c", str(-offset), path]
        try:
            out = await self._as(user, argv, f"reading {path}", encoding=None)
        except BackendError as exc:
            if "No such file" in exc.message:
                return b""
            raise
        return bytes(out)

    async def fetch(self, user: str | None, path: str, local: str) -> None:
        """Copy ``path`` to the local file ``local``."""
        data = await self.read(user, path)
        if not data and not await self.exists(user, path):
            raise BackendError(f"{path} does not exist")
        with open(local, "wb") as f:
            f.write(data)

    async def exists(self, user: str | None, path: str) -> bool:
        """Whether ``path`` exists (asked as ``user`` when the service may not look)."""
        try:
            os.stat(path)
            return True
        except FileNotFoundError:
            return False
        except PermissionError:
            if user is None:
                return False
        result = await run_local(as_user(user, ["test", "-e", path]), env=self.env)
        return result.exit_status == 0


class Relay:
    """A local TCP port relayed to ``remote_host:remote_port`` (a lease kernel's socket).

    Shaped like :class:`~jupyter_gpusched.cluster.ssh.Forward`, so the kernel bridge uses
    either alike.
    """

    def __init__(self, node: str, server: asyncio.Server, remote_host: str, remote_port: int):
        self.node = node
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.local_port: int = server.sockets[0].getsockname()[1]
        self._server = server
        self._pipes: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls, node: str, listen_host: str, local_port: int, remote_host: str, remote_port: int
    ) -> Relay:
        """Listen on ``listen_host:local_port`` (0 = any) and relay each connection."""
        relay: Relay | None = None

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert relay is not None
            task = asyncio.current_task()
            assert task is not None
            relay._pipes.add(task)
            try:
                await relay._connect(reader, writer)
            finally:
                relay._pipes.discard(task)

        try:
            server = await asyncio.start_server(accept, listen_host, local_port)
        except OSError as exc:
            raise BackendError(
                f"node {node}: cannot listen on {listen_host}:{local_port}: {exc}"
            ) from None
        relay = cls(node, server, remote_host, remote_port)
        return relay

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.remote_host, self.remote_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(OSError, RuntimeError):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        """Stop listening and drop the relayed connections."""
        self._server.close()
        for task in list(self._pipes):
            task.cancel()

    async def wait_closed(self) -> None:
        """Wait until the listener is shut down."""
        await self._server.wait_closed()
