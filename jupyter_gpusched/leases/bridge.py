"""Remote kernels for leases: the plugin that makes ``%%gpu`` cells run on the placed node.

A lease is a job of kind ``lease``. Its command (see :func:`lease_command`) starts an ipykernel
on the node under the agent's wrapper, so ``CUDA_VISIBLE_DEVICES`` is set, ``JPY_PARENT_PID`` is
gone (a detached kernel would otherwise shut itself down) and cancel TERMs its process group.
It writes a 0600 connection file in the job's directory (CurveZMQ keys, ports 0); the kernel
binds 127.0.0.1 on the node, encrypts its sockets and fills in the ports it bound.

Server side, :class:`KernelBridge` reads that file once the lease runs (one agent command, run
as the lease's owner, that waits for it), forwards the five kernel ports over the server's own
SSH connection to local 127.0.0.1 ports, and hands the local connection info to the lease's
owner (``GET gpusched/api/leases/{id}/kernel``, see
:mod:`jupyter_gpusched.server.handlers.leases`). A dropped SSH connection closes the forwards;
the next request for the connection forwards again onto the *same* local ports, so connected
kernel clients only need to reconnect. When the lease ends, its forwards close.

The node side is :mod:`jupyter_gpusched.node.kernel`; the client side, which relays a cell's
outputs into the user's notebook, is :mod:`jupyter_gpusched.client.remote`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyter_gpusched.core.models import Job
    from jupyter_gpusched.scheduling.scheduler import Scheduler

from jupyter_gpusched.node.kernel import MODULE as _MODULE
from jupyter_gpusched.node.kernel import PORT_KEYS

log = logging.getLogger(__name__)


def connection_file_name(job: Job) -> str:
    """Name of the lease kernel's connection file; unique per job and attempt."""
    return f"kernel-{job.id}.{job.attempt}.json"


def lease_command(job: Job, python: str = "python3") -> list[str]:
    """The argv the agent launches for a lease: this module's ``kernel`` subcommand on the node."""
    return [python, "-m", _MODULE, "kernel", "--connection-file", connection_file_name(job)]


class _LeaseKernel:
    """One running lease's forwards: remote kernel ports -> fixed local ports."""

    def __init__(
        self, job_id: int, attempt: int, node: str, remote: dict[str, Any], ip: str
    ) -> None:
        self.job_id = job_id
        self.ip = ip  # where the forwards listen, and where clients connect
        self.attempt = attempt
        self.node = node
        self.remote = remote  # the node's connection file
        self.local_ports: dict[str, int] = {}
        self.forwards: list[Any] = []
        self.generation = 0  # bumped on every (re-)forward; clients reconnect when it changes
        self.watcher: asyncio.Task[None] | None = None

    def connection(self) -> dict[str, Any]:
        """The connection info a local kernel client needs."""
        info = {
            "transport": "tcp",
            "ip": self.ip,
            "key": self.remote.get("key", ""),
            "signature_scheme": self.remote.get("signature_scheme", "hmac-sha256"),
            **{k: self.local_ports[k] for k in PORT_KEYS},
        }
        for key in ("curve_publickey", "curve_secretkey"):
            if self.remote.get(key):
                info[key] = self.remote[key]
        if self.remote.get("kernel_name"):
            info["kernel_name"] = self.remote["kernel_name"]
        return info

    def forwards_alive(self) -> bool:
        return bool(self.forwards) and not any(getattr(f, "_gone", False) for f in self.forwards)

    async def close_forwards(self) -> None:
        """Close the forwards and wait until their ports are free to listen on again."""
        forwards, self.forwards = self.forwards, []
        for forward in forwards:
            with contextlib.suppress(Exception):
                forward.close()
        for forward in forwards:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await forward.wait_closed()


class KernelBridge:
    """Remote lease kernels made reachable on this server's loopback.

    Parameters
    ----------
    scheduler
        The scheduler whose leases are bridged (for job records and the end hook).
    backend
        An :class:`~jupyter_gpusched.cluster.ssh.SshBackend` (``kernel_connection``,
        ``remove_file``, ``forward_local_ports``).
    connect_timeout_s
        How long to wait for a freshly started kernel to write its connection file.
    listen_ip
        Where the forwarded ports listen (and clients connect): loopback, or an address the
        users' servers on other hosts reach.
    """

    def __init__(
        self,
        scheduler: Any,
        backend: Any,
        *,
        connect_timeout_s: float = 30.0,
        listen_ip: str = "127.0.0.1",
    ) -> None:
        self.scheduler = scheduler
        self.backend = backend
        self.connect_timeout_s = connect_timeout_s
        self.listen_ip = listen_ip
        self._kernels: dict[int, _LeaseKernel] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def connection(self, job: Job) -> tuple[dict[str, Any], int]:
        """Local connection info of a running lease's kernel, and its forward generation."""
        lock = self._locks.setdefault(job.id, asyncio.Lock())
        async with lock:
            lk = self._kernels.get(job.id)
            if lk is not None and lk.attempt != job.attempt:
                await self._drop(job.id)  # a requeued lease runs a new kernel elsewhere
                lk = None
            if lk is None:
                lk = await self._open(job)
                self._kernels[job.id] = lk
            elif not lk.forwards_alive():
                await self._forward(lk)
            return lk.connection(), lk.generation

    async def on_job_end(self, job: Job) -> None:
        """End hook: close the lease's forwards and remove its connection file on the node."""
        self._locks.pop(job.id, None)
        await self._drop(job.id)
        if job.spec.kind.value != "lease" or not job.handle.get("node"):
            return
        with contextlib.suppress(Exception):  # best effort: the node may be gone
            await self.backend.remove_file(job, self._remote_path(job))

    async def close(self) -> None:
        """Close every forward (server shutdown); the kernels keep running on their nodes."""
        for job_id in list(self._kernels):
            await self._drop(job_id)

    # ------------------------------------------------------------------ internals

    def _remote_path(self, job: Job) -> str:
        base = job.spec.workdir or job.handle.get("job_dir") or "."
        return f"{base.rstrip('/')}/{connection_file_name(job)}"

    async def _open(self, job: Job) -> _LeaseKernel:
        from jupyter_gpusched.core.errors import BackendError, ConflictError

        node = job.handle.get("node") or (job.placement.node if job.placement else None)
        if not node or not job.handle.get("job_dir"):
            raise ConflictError(f"lease {job.id} has no launch record yet; ask again shortly")
        try:
            remote = await self.backend.kernel_connection(
                job, self._remote_path(job), timeout_s=self.connect_timeout_s
            )
        except BackendError as exc:
            raise BackendError(
                f"lease {job.id}: the kernel on {node} did not start: {exc.message}"
            ) from None
        lk = _LeaseKernel(job.id, job.attempt, node, remote, self.listen_ip)
        await self._forward(lk)
        return lk

    async def _forward(self, lk: _LeaseKernel) -> None:
        """Forward the five ports, onto the same local ports as before when there were any."""
        await lk.close_forwards()
        host = str(lk.remote.get("ip") or "127.0.0.1")
        targets = [(host, int(lk.remote[key]), lk.local_ports.get(key, 0)) for key in PORT_KEYS]
        forwards = await self.backend.forward_local_ports(lk.node, targets, listen_host=lk.ip)
        for key, forward in zip(PORT_KEYS, forwards, strict=True):
            lk.local_ports[key] = forward.local_port
        lk.forwards = forwards
        lk.generation += 1
        if lk.watcher is not None:
            lk.watcher.cancel()
        lk.watcher = asyncio.get_running_loop().create_task(
            self._watch(forwards), name=f"gpusched-lease-{lk.job_id}-forwards"
        )

    async def _watch(self, forwards: list[Any]) -> None:
        """Mark the forwards gone once one closes (the SSH connection dropped).

        Forwarding again is left to the next :meth:`connection` call (clients ask when their
        heartbeat stops), so nothing reconnects behind a server that is shutting down.
        """
        waits = [asyncio.ensure_future(f.wait_closed()) for f in forwards]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        for f in forwards:
            f._gone = True  # noqa: SLF001 - our own marker on the Forward object

    async def _drop(self, job_id: int) -> None:
        lk = self._kernels.pop(job_id, None)
        if lk is None:
            return
        if lk.watcher is not None:
            lk.watcher.cancel()
        await lk.close_forwards()
        if lk.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lk.watcher


def _node_python(backend: Any, node: str) -> str:
    """The interpreter that can import jupyter_gpusched on ``node`` (its NodeConfig says)."""
    return str(backend.node_config(node).python)


# ---------------------------------------------------------------------------- plugin hooks

_BRIDGES: weakref.WeakKeyDictionary[Any, KernelBridge] = weakref.WeakKeyDictionary()


def bridge_for(scheduler: Scheduler) -> KernelBridge:
    """The bridge :func:`install` attached to ``scheduler``."""
    try:
        return _BRIDGES[scheduler]
    except KeyError:
        from jupyter_gpusched.core.errors import ConflictError

        raise ConflictError("lease kernels are not enabled on this server") from None


def install(scheduler: Scheduler, backend: Any) -> None:
    """Enable leases: their command, the bridge, and its end hook."""
    from jupyter_gpusched.core.models import JobKind

    def build(job: Job) -> Sequence[str]:
        node = job.placement.node if job.placement else ""
        return lease_command(job, _node_python(backend, node))

    bridge = KernelBridge(scheduler, backend)
    scheduler.commands[JobKind.LEASE] = build
    scheduler.end_hooks.append(bridge.on_job_end)
    _BRIDGES[scheduler] = bridge
