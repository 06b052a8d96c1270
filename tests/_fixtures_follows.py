"""Log follows a test opens and drops as a client would, and the node processes they leave.

:class:`Follow` speaks raw HTTP on its own socket (an HTTP client library would hide the
moment its connection goes). :func:`node_followers` counts the ``agent log --follow``
processes that the in-process server's simulated nodes run -- real local processes, found
through ``/proc`` by the node marker in their environment, so another test session's nodes
running beside this one are never counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from _fixtures_server import TOKEN_USER_HEADER

from jupyter_gpusched.cluster.sim.nvml import node_pids


class Follow:
    """A raw ``log?follow=1`` request that a test can drop as a client would."""

    def __init__(self, app: Any, job_id: int, user: str) -> None:
        self.app, self.job_id, self.user = app, job_id, user
        self.status = ""

    async def open(self, timeout_s: float = 30.0) -> Follow:
        """Send the request and read the status line (sent once the follow is on)."""
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.app.port)
        path = f"{self.app.base_url}gpusched/api/jobs/{self.job_id}/log?follow=1"
        token = self.app.identity_provider.token
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {token}\r\n"
            f"{TOKEN_USER_HEADER}: {self.user}\r\n\r\n".encode()
        )
        await self.writer.drain()
        line = await asyncio.wait_for(self.reader.readline(), timeout_s)
        self.status = line.decode().split()[1]
        return self

    def drop(self) -> None:
        """Go away without a word, as a closed browser tab or a killed client does."""
        self.writer.close()


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def node_followers(app: Any) -> list[int]:
    """Pids of the log followers running on the server's simulated nodes."""
    sim = app.web_app.settings["gpusched_app"]._sim
    found = []
    for name in sim.node_names:
        for pid in node_pids(str(sim.state_path(name))):
            argv = _cmdline(pid)
            if b"--follow" in argv and b"log" in argv:
                found.append(pid)
    return found
