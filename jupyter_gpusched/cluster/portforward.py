"""Kernel port forwards in their own process, so their bytes are not encrypted on the server's loop.

A GPU kernel's every message crosses an SSH forward; done by the Jupyter server's own asyncssh
connection, each cell costs the server's event loop about a millisecond of encryption. The
forwarder is a child process (``python -m jupyter_gpusched.cluster.portforward``) holding its
own connection to the node, checked against the same known_hosts file with the same keys. It
reads one JSON request on stdin, answers one JSON line on stdout (the bound ports, or the error),
and forwards until its connection drops or its stdin closes (the server closed it, or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
from typing import Any

from jupyter_gpusched.core.errors import BackendError

#: How long the parent waits for the child's answer (start-up, connect, listen).
ANSWER_TIMEOUT_S = 60.0


class ProcessForward:
    """One forwarded local port of a :class:`Forwarder` (the interface of ``Forward``)."""

    def __init__(self, owner: Forwarder, local_port: int, remote_host: str, remote_port: int):
        self.node = owner.node
        self.local_port = local_port
        self.remote_host = remote_host
        self.remote_port = remote_port
        self._owner = owner

    def close(self) -> None:
        """Stop the forwarder: its ports are used together, so closing one closes all."""
        self._owner.close()

    async def wait_closed(self) -> None:
        """Wait until the forwarder has exited (closed, or its SSH connection dropped)."""
        await self._owner.wait_closed()


class Forwarder:
    """The parent's handle on one forwarder process."""

    def __init__(self, node: str, process: asyncio.subprocess.Process) -> None:
        self.node = node
        self._process = process

    @classmethod
    async def start(
        cls,
        node: str,
        host: str,
        options: dict[str, Any],
        listen_host: str,
        targets: list[tuple[str, int, int]],
    ) -> list[ProcessForward]:
        """Forward each ``(remote_host, remote_port, local_port)``; local port 0 picks one."""
        request = {"host": host, "options": options, "listen_host": listen_host}
        request["targets"] = [list(t) for t in targets]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        owner = cls(node, process)
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(request).encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                line = await process.stdout.readline()
            answer = json.loads(line) if line else {"error": "the forwarder exited"}
        except (TimeoutError, OSError, ValueError) as exc:
            answer = {"error": f"the forwarder did not answer: {exc or type(exc).__name__}"}
        if "error" in answer:
            owner.close()
            await owner.wait_closed()
            raise BackendError(f"node {node}: cannot forward the kernel's ports: {answer['error']}")
        return [
            ProcessForward(owner, int(port), remote_host, remote_port)
            for port, (remote_host, remote_port, _) in zip(answer["ports"], targets, strict=True)
        ]

    def close(self) -> None:
        """Kill the process: its listeners and connection go with it."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    async def wait_closed(self) -> None:
        """Wait for the process to exit."""
        await self._process.wait()


# ---------------------------------------------------------------------------- the child


async def _serve(request: dict[str, Any]) -> None:
    import asyncssh

    loop = asyncio.get_running_loop()
    stdin_closed = loop.create_future()

    def watch_stdin() -> None:
        with contextlib.suppress(Exception):
            sys.stdin.buffer.read()
        loop.call_soon_threadsafe(lambda: stdin_closed.done() or stdin_closed.set_result(None))

    try:
        host, options, listen_host = request["host"], request["options"], request["listen_host"]
        targets = [(str(h), int(p), int(local)) for h, p, local in request["targets"]]
    except (KeyError, TypeError, ValueError) as exc:
        _answer({"error": f"bad request: {exc!r}"})
        return
    try:
        conn = await asyncssh.connect(host, **options)
        listeners = [
            await conn.forward_local_port(listen_host, local, remote_host, remote_port)
            for remote_host, remote_port, local in targets
        ]
    except (OSError, asyncssh.Error) as exc:
        _answer({"error": str(exc) or type(exc).__name__})
        return
    _answer({"ports": [listener.get_port() for listener in listeners]})
    threading.Thread(target=watch_stdin, daemon=True).start()
    closed = asyncio.ensure_future(conn.wait_closed())
    await asyncio.wait([closed, stdin_closed], return_when=asyncio.FIRST_COMPLETED)
    conn.close()


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    """The child: read the request, forward, answer, and run until told or cut off."""
    try:
        request = json.loads(sys.stdin.buffer.readline())
    except ValueError as exc:
        _answer({"error": f"bad request: {exc}"})
        return
    asyncio.run(_serve(request))
    os._exit(0)  # the stdin thread may still block in read()


if __name__ == "__main__":
    main()
