"""The node side of the Slurm backend: logs, files and lease kernels' ports.

What the plugins ask a backend for beyond the job protocol (``run``, ``forward_local_ports``,
``node_config``, ``fetch_file``, ``kernel_connection``, ``remove_file``), and the job logs.
Files are on the filesystem the service shares with the nodes; a node named in the app's
``nodes`` is reached over SSH instead (lease kernels on nodes whose address the service cannot
reach).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from jupyter_gpusched.core.errors import BackendError
from jupyter_gpusched.core.models import Job

from ..ssh.config import NodeConfig, RemoteResult
from .access import Relay, SharedFiles, run_local
from .parse import SlurmNode
from .states import JobStates


class NodeSide:
    """Mixed into :class:`~.backend.SlurmBackend`, whose state it reads."""

    # Set by the backend.
    _ssh: Any
    _nodes: dict[str, SlurmNode]
    states: JobStates
    python: str

    def _env(self) -> dict[str, str]:
        raise NotImplementedError  # the backend's

    def _of(self, job: Job) -> tuple[int, str | None, dict[str, Any]]:
        raise NotImplementedError  # the backend's

    async def read_log(self, job: Job, *, offset: int = 0, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes of the job's log from ``offset`` (empty before it exists)."""
        _, user, h = self._of(job)
        return await SharedFiles(self._env()).read(user, str(h["log"]), offset, limit)

    async def follow_log(self, job: Job, *, offset: int = 0) -> AsyncIterator[bytes]:
        """Yield the log as it grows, until the job has ended (per the latest poll)."""
        slurm_id, user, h = self._of(job)
        files = SharedFiles(self._env())
        while True:
            chunk = await files.read(user, str(h["log"]), offset, 65536)
            if chunk:
                offset += len(chunk)
                yield chunk
                continue
            known = slurm_id in self.states.last
            row = self.states.last.get(slurm_id)
            if known and (row is None or not row.active):  # ended (or forgotten by Slurm)
                while chunk := await files.read(user, str(h["log"]), offset, 65536):
                    offset += len(chunk)
                    yield chunk
                return
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ nodes, for plugins
    def _over_ssh(self, node: str) -> bool:
        return self._ssh is not None and node in self._ssh.node_names

    def _address(self, node: str) -> str:
        known = self._nodes.get(node)
        return known.addr if known is not None else node

    def node_config(self, node: str) -> NodeConfig:
        """How a node is reached (its interpreter, for notebook and lease commands)."""
        if self._over_ssh(node):
            return self._ssh.node_config(node)  # type: ignore[no-any-return]
        return NodeConfig(name=node, host=self._address(node), python=self.python)

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
        """Run ``argv`` for ``node``: over SSH when configured, else here (shared files)."""
        if self._over_ssh(node):
            return await self._ssh.run(  # type: ignore[no-any-return]
                node, argv, timeout_s=timeout_s, check=check, input=input, encoding=encoding
            )
        result = await run_local(
            argv, env=None, timeout_s=timeout_s, input=input, encoding=encoding
        )
        if check and result.exit_status != 0:
            raise BackendError(f"{argv[0]} exited with {result.exit_status}: {result.stderr}")
        return result

    async def forward_local_ports(
        self,
        node: str,
        targets: Sequence[tuple[str, int, int]],
        *,
        listen_host: str = "127.0.0.1",
    ) -> list[Any]:
        """Local ports reaching a node's ports: SSH forwards, or relays to its address."""
        if self._over_ssh(node):
            return await self._ssh.forward_local_ports(node, targets, listen_host=listen_host)
        return [
            await Relay.open(node, listen_host, local_port, remote_host, remote_port)
            for remote_host, remote_port, local_port in targets
        ]

    async def fetch_file(self, job: Job, remote: str, local: str) -> None:
        """Copy a file of the job's dir (shared filesystem) to ``local``, read as its owner."""
        _, user, _ = self._of(job)
        await SharedFiles(self._env()).fetch(user, remote, local)

    async def kernel_connection(self, job: Job, path: str, *, timeout_s: float) -> dict[str, Any]:
        """A lease kernel's connection info once the kernel has written its file."""
        node = str(job.handle.get("node"))
        python = self.node_config(node).python
        argv = [python, "-m", "jupyter_gpusched.node.kernel", "connection", "--path", path]
        result = await self.run(
            node, [*argv, "--timeout", str(timeout_s)], timeout_s=timeout_s + 30
        )
        try:
            answer = json.loads(result.stdout)
        except (TypeError, ValueError):
            answer = None
        if result.exit_status != 0 or not isinstance(answer, dict) or "error" in answer:
            why = answer.get("error") if isinstance(answer, dict) else None
            raise BackendError(why or str(result.stderr or result.stdout).strip()[-500:])
        return answer

    async def remove_file(self, job: Job, path: str) -> None:
        """Remove a lease kernel's connection file (best effort, on the shared filesystem)."""
        await self.run(str(job.handle.get("node")), ["rm", "-f", path], timeout_s=15)
