"""Remote kernels for leases: the plugin that makes ``%%gpu`` cells run on the placed node.

A lease is a job of kind ``lease``. Its command (see :func:`lease_command`) starts an ipykernel
on the node under the agent's wrapper, so ``CUDA_VISIBLE_DEVICES`` is set, ``JPY_PARENT_PID`` is
gone (a detached kernel would otherwise shut itself down) and cancel TERMs its process group.
It writes a 0600 connection file in the job's directory (CurveZMQ keys, ports 0); the kernel
binds 127.0.0.1 on the node, encrypts its sockets and fills in the ports it bound.

Server side, :class:`KernelBridge` reads that file once the lease runs (one SSH command that
waits for it), forwards the five kernel ports over the server's own SSH connection to local
127.0.0.1 ports, and hands the local connection info to the lease's owner
(``GET gpusched/api/leases/{id}/kernel``, see :mod:`.kernel_handlers`). A dropped SSH connection
closes the forwards; the next request for the connection forwards again onto the *same* local
ports, so connected kernel clients only need to reconnect. When the lease ends, its forwards
close.

Client side, :func:`run_remote` runs a cell through a kernel client connected to those ports
and relays its outputs into the local cell (used by the ``%%gpu`` magic).

This module also runs on the nodes (``python -m jupyter_gpusched.kernels kernel|connection``),
so its top level imports only the standard library.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job
    from .scheduler import Scheduler

log = logging.getLogger(__name__)

#: The ports of a kernel connection, in the order jupyter_client lists them.
PORT_KEYS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: Environment variable of a lease: the directory the remote kernel should work in, if the
#: node has it (the simulated nodes share this machine's filesystem; real ones usually not).
KERNEL_CWD_ENV = "GPUSCHED_KERNEL_CWD"
_MODULE = "jupyter_gpusched.kernels"


def connection_file_name(job: Job) -> str:
    """Name of the lease kernel's connection file; unique per job and attempt."""
    return f"kernel-{job.id}.{job.attempt}.json"


def lease_command(job: Job, python: str = "python3") -> list[str]:
    """The argv the agent launches for a lease: this module's ``kernel`` subcommand on the node."""
    return [python, "-m", _MODULE, "kernel", "--connection-file", connection_file_name(job)]


class _LeaseKernel:
    """One running lease's forwards: remote kernel ports -> fixed local ports."""

    def __init__(self, job_id: int, attempt: int, node: str, remote: dict[str, Any]) -> None:
        self.job_id = job_id
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
            "ip": "127.0.0.1",
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

    def close_forwards(self) -> None:
        for forward in self.forwards:
            with contextlib.suppress(Exception):
                forward.close()
        self.forwards = []


class KernelBridge:
    """Remote lease kernels made reachable on this server's loopback.

    Parameters
    ----------
    scheduler
        The scheduler whose leases are bridged (for job records and the end hook).
    backend
        An :class:`~jupyter_gpusched.ssh.SshBackend` (``run``, ``forward_local_port``).
    connect_timeout_s
        How long to wait for a freshly started kernel to write its connection file.
    """

    def __init__(self, scheduler: Any, backend: Any, *, connect_timeout_s: float = 30.0) -> None:
        self.scheduler = scheduler
        self.backend = backend
        self.connect_timeout_s = connect_timeout_s
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
        path = self._remote_path(job)
        with contextlib.suppress(Exception):  # best effort: the node may be gone
            await self.backend.run(job.handle["node"], ["rm", "-f", path], timeout_s=15)

    async def close(self) -> None:
        """Close every forward (server shutdown); the kernels keep running on their nodes."""
        for job_id in list(self._kernels):
            await self._drop(job_id)

    # ------------------------------------------------------------------ internals

    def _remote_path(self, job: Job) -> str:
        base = job.spec.workdir or job.handle.get("job_dir") or "."
        return f"{base.rstrip('/')}/{connection_file_name(job)}"

    async def _open(self, job: Job) -> _LeaseKernel:
        from .exceptions import BackendError, ConflictError

        node = job.handle.get("node") or (job.placement.node if job.placement else None)
        if not node or not job.handle.get("job_dir"):
            raise ConflictError(f"lease {job.id} has no launch record yet; ask again shortly")
        argv = [
            _node_python(self.backend, node),
            "-m",
            _MODULE,
            "connection",
            "--path",
            self._remote_path(job),
            "--timeout",
            str(self.connect_timeout_s),
        ]
        result = await self.backend.run(node, argv, timeout_s=self.connect_timeout_s + 30)
        try:
            remote = json.loads(result.stdout)
        except (TypeError, ValueError):
            remote = None
        if result.exit_status != 0 or not isinstance(remote, dict) or "error" in remote:
            why = (remote or {}).get("error") if isinstance(remote, dict) else None
            why = why or str(result.stderr or result.stdout).strip()[-500:]
            raise BackendError(f"lease {job.id}: the kernel on {node} did not start: {why}")
        lk = _LeaseKernel(job.id, job.attempt, node, remote)
        await self._forward(lk)
        return lk

    async def _forward(self, lk: _LeaseKernel) -> None:
        """Forward the five ports, onto the same local ports as before when there were any."""
        lk.close_forwards()
        host = str(lk.remote.get("ip") or "127.0.0.1")
        forwards = []
        try:
            for key in PORT_KEYS:
                forward = await self.backend.forward_local_port(
                    lk.node, host, int(lk.remote[key]), local_port=lk.local_ports.get(key, 0)
                )
                forwards.append(forward)
                lk.local_ports[key] = forward.local_port
        except BaseException:
            for forward in forwards:
                forward.close()
            raise
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
        lk.close_forwards()
        if lk.watcher is not None:
            lk.watcher.cancel()
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
        from .exceptions import ConflictError

        raise ConflictError("lease kernels are not enabled on this server") from None


def install(scheduler: Scheduler, backend: Any) -> None:
    """Enable leases: their command, the bridge, and its end hook."""
    from .models import JobKind

    def build(job: Job) -> Sequence[str]:
        node = job.placement.node if job.placement else ""
        return lease_command(job, _node_python(backend, node))

    bridge = KernelBridge(scheduler, backend)
    scheduler.commands[JobKind.LEASE] = build
    scheduler.end_hooks.append(bridge.on_job_end)
    _BRIDGES[scheduler] = bridge


def __getattr__(name: str) -> Any:
    # Routes are imported on first use: on the nodes this module must not import the server.
    if name == "handlers":
        from .kernel_handlers import handlers

        return handlers
    raise AttributeError(name)


# ---------------------------------------------------------------------------- on the node


def serve_kernel(connection_file: str) -> None:
    """Replace this process with an ipykernel bound to 127.0.0.1 (keeps pid and group).

    The connection file is resolved against the start directory (the job's), then the kernel
    moves to ``$GPUSCHED_KERNEL_CWD`` when that directory exists here.
    """
    path = os.path.abspath(os.path.expanduser(connection_file))
    os.environ.pop("JPY_PARENT_PID", None)
    cwd = os.environ.pop(KERNEL_CWD_ENV, "")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    os.umask(0o077)  # the connection file holds the session key
    _write_curve_connection(path)
    argv = [
        sys.executable,
        "-m",
        "ipykernel_launcher",
        "-f",
        path,
        "--ip=127.0.0.1",
        "--transport=tcp",
        "--HistoryManager.enabled=False",
    ]
    sys.stdout.flush()
    os.execv(sys.executable, argv)


def _write_curve_connection(path: str) -> None:
    """Pre-write the connection file with CurveZMQ keys (ports 0: the kernel picks them).

    Over TCP any local user of a shared node could otherwise subscribe to IOPub and read the
    cells and outputs (the session key signs, it does not hide). ipykernel loads the keys,
    encrypts every socket, and merges the ports it bound into this file; jupyter_client
    clients pick the keys up from the connection info. Without libsodium, plain TCP.
    """
    import secrets

    try:
        import zmq
    except ImportError:
        return
    if not zmq.has("curve"):
        return
    public, secret = zmq.curve_keypair()
    info = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "key": secrets.token_hex(32),
        "signature_scheme": "hmac-sha256",
        **{k: 0 for k in PORT_KEYS},
        "curve_publickey": public.decode("ascii"),
        "curve_secretkey": secret.decode("ascii"),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)


def wait_connection(path: str, timeout_s: float) -> dict[str, Any]:
    """The kernel's connection info once its file is complete (written after it bound)."""
    path = os.path.abspath(os.path.expanduser(path))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                info = json.load(f)
            if isinstance(info, dict) and all(info.get(k) for k in PORT_KEYS):
                return info
        except (OSError, ValueError):
            pass  # not there yet, or half written
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no kernel connection file {path} after {timeout_s:g} s")
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    """``kernel --connection-file F`` (start) or ``connection --path F`` (print info)."""
    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    kp = sub.add_parser("kernel", help="run a lease's ipykernel")
    kp.add_argument("--connection-file", required=True)
    cp = sub.add_parser("connection", help="print a kernel's connection info when ready")
    cp.add_argument("--path", required=True)
    cp.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.cmd == "kernel":
        serve_kernel(args.connection_file)
        return 0  # not reached: exec
    try:
        print(json.dumps(wait_connection(args.path, args.timeout)))
    except (TimeoutError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    return 0


# ---------------------------------------------------------------------------- in the user's kernel

#: How long the remote kernel may miss heartbeats before ``silent`` is asked what happened.
SILENT_AFTER_S = 3.0


class RemoteError(Exception):
    """An exception raised in the remote kernel; shows the remote traceback only."""

    def __init__(self, ename: str, evalue: str, traceback: list[str]) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback

    def _render_traceback_(self) -> list[str]:
        return list(self.traceback) or [f"{self.ename}: {self.evalue}"]


def remote_error(content: dict[str, Any]) -> RemoteError:
    """An exception named like the remote one (the cell reports ``ZeroDivisionError``...)."""
    ename = str(content.get("ename") or "RemoteError")
    cls = type(
        ename if ename.isidentifier() else "RemoteError", (RemoteError,), {"__module__": "remote"}
    )
    return cls(ename, str(content.get("evalue") or ""), list(content.get("traceback") or []))


class RemoteResult:
    """The remote cell's ``execute_result``, displayed locally as the cell's value."""

    def __init__(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.data = data
        self.metadata = metadata

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        return self.data, self.metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", "<remote result>"))


class StopWaiting(Exception):
    """Ctrl-C pressed three times: the remote code ignores interrupts; stop waiting for it."""


def beating(kc: Any) -> bool:
    """Whether the remote kernel answers its heartbeat (no thread hop, unlike is_alive())."""
    return bool(kc.hb_channel.is_beating())


def run_remote(
    kc: Any,
    code: str,
    *,
    allow_stdin: bool = False,
    tick: Any = None,
    silent: Any = None,
) -> RemoteResult | None:
    """Execute ``code`` through ``kc`` and relay its outputs into the running local cell.

    Streams, displays (and their updates) and clear_output are re-published as they arrive;
    the ``execute_result`` is returned (its repr shows as the cell's value); an error raises
    :class:`RemoteError`. Ctrl-C sends ``interrupt_request`` on the control channel and keeps
    relaying (the remote ``KeyboardInterrupt`` comes back as the error); the third raises
    :class:`StopWaiting`. ``tick()`` runs every poll; ``silent(started)`` runs after
    :data:`SILENT_AFTER_S` without heartbeat (it may raise to give up).
    """
    import queue

    import zmq

    msg_id = kc.execute(code, store_history=True, allow_stdin=allow_stdin)
    poller = zmq.Poller()
    poller.register(kc.iopub_channel.socket, zmq.POLLIN)
    if allow_stdin:
        poller.register(kc.stdin_channel.socket, zmq.POLLIN)
    result: RemoteResult | None = None
    error: dict[str, Any] | None = None
    silent_since: float | None = None
    started = idle = False
    interrupts = 0
    while not idle:
        try:
            ready = dict(poller.poll(200))
            if tick is not None:
                tick()
            if not ready:
                if beating(kc):
                    silent_since = None
                    continue
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > SILENT_AFTER_S and silent is not None:
                    silent(started)
                    silent_since = None
                continue
            if allow_stdin and kc.stdin_channel.socket in ready:
                _answer_input(kc)
            while not idle:
                try:
                    msg = kc.iopub_channel.get_msg(timeout=0)
                except queue.Empty:
                    break
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                started = True
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status":
                    idle = content.get("execution_state") == "idle"
                elif kind == "execute_result":
                    result = RemoteResult(content.get("data", {}), content.get("metadata", {}))
                elif kind == "error":
                    error = content
                else:
                    _relay(kind, content)
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 3:
                raise StopWaiting from None
            kc.control_channel.send(kc.session.msg("interrupt_request", {}))
    reply = _shell_reply(kc, msg_id)
    if error is None and reply is not None and reply["content"].get("status") == "error":
        error = reply["content"]
    if error is not None:
        raise remote_error(error)
    return result


def _relay(kind: str, content: dict[str, Any]) -> None:
    """Show one remote IOPub output in the local cell."""
    from IPython.display import clear_output, publish_display_data

    if kind == "stream":
        stream = sys.stderr if content.get("name") == "stderr" else sys.stdout
        stream.write(content.get("text", ""))
        stream.flush()  # arrives in the cell as it came, in order with displays
    elif kind in ("display_data", "update_display_data"):
        publish_display_data(
            content.get("data", {}),
            content.get("metadata", {}),
            transient=content.get("transient") or {},
            update=kind == "update_display_data",
        )
    elif kind == "clear_output":
        clear_output(wait=bool(content.get("wait")))


def _answer_input(kc: Any) -> None:
    import queue

    try:
        msg = kc.stdin_channel.get_msg(timeout=0)
    except queue.Empty:
        return
    if msg["msg_type"] != "input_request":
        return
    prompt = msg["content"].get("prompt", "")
    if msg["content"].get("password"):
        import getpass

        kc.input(getpass.getpass(prompt))
    else:
        kc.input(input(prompt))


def _shell_reply(kc: Any, msg_id: str) -> dict[str, Any] | None:
    import queue

    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            msg = kc.shell_channel.get_msg(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None


if __name__ == "__main__":
    sys.exit(main())
