"""A whole notebook on a GPU: a kernel provisioner whose kernels are leases' remote kernels.

Registered as ``gpusched-provisioner`` in jupyter_client's ``jupyter_client.kernel_provisioners``
group, it is named by GPU kernelspecs (:mod:`.kernelspecs`). It runs inside the user's Jupyter
server (or any kernel manager) and speaks only the gpusched REST API of that server, which in
client mode forwards to the lab-wide service, so it works the same in both.

Life of a kernel:

- ``pre_launch`` submits a lease with the kernelspec's resources, overridden by the notebook's
  ``metadata.gpusched.kernel``; a restart keeps the lease unless the request changed. The lease
  is named after its notebook. A notebook opened again while its kernel still waits (a
  reloaded page) takes that waiting lease over instead of asking for more GPUs.
- ``launch_kernel`` waits while the lease is queued (the server log and the lab's notification
  say where it stands; cancelling the lease ends the start, a 409 and an info line, not a
  server error), then returns the connection info of the lease's remote ipykernel: ports the
  scheduler forwards to its loopback (CurveZMQ keys, session key). Once the kernel answers,
  the lease is touched (its idle time counts from there) and the log says where it runs.
- A watcher reports the kernel's activity to the lease (so the window's idle timeout counts
  real use), asks the server to forward again when heartbeats stop (a dropped SSH connection),
  and shuts the kernel down, as Jupyter's own culler would, when the lease was ended under it
  (idle reclaim, cancel, max runtime). A kernel that died by itself is reported dead, and
  Jupyter's restarter starts it again on a new lease.
- Restart: the remote kernel's supervisor starts it again inside the lease, on the same ports;
  ``launch_kernel`` then waits for the new process (a new pid in ``kernel_info_reply``).
  Interrupts go as ``interrupt_request`` messages; kill and terminate release the lease;
  ``cleanup`` releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import time
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Float, Unicode

from jupyter_gpusched.core.api import JobView
from jupyter_gpusched.core.errors import GpuSchedError, InvalidSpecError
from jupyter_gpusched.core.models import TERMINAL_STATES, JobState
from jupyter_gpusched.core.units import format_duration_s
from jupyter_gpusched.node.kernel import KERNEL_CWD_ENV

from .kernel_lease import (
    GpuKernelError,
    GpuKernelNotStarted,
    KernelLease,
    connection_info,
    exit_status,
    placed_text,
    quiet_not_started,
)
from .kernel_wire import KernelWire
from .kernelspecs import FIELDS, lease_fields, notebook_fields

__all__ = ["GpuKernelError", "GpuKernelNotStarted", "GpuLeaseProvisioner"]

#: Labels of a kernel's lease: the kernel's id and the notebook's name (the lab shows them).
KERNEL_LABEL, NOTEBOOK_LABEL = "gpusched.kernel", "gpusched.notebook"

#: Kernels waiting for their lease, by (kernel manager, notebook path): a second start for the
#: same notebook (its page was reloaded while it waited) takes the waiting lease over.
_WAITING: dict[tuple[int, str], GpuLeaseProvisioner] = {}


class GpuLeaseProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """Kernels on leased GPUs: a lease per kernel, its remote ipykernel as the kernel."""

    url = Unicode(
        "",
        help="URL of the Jupyter server whose gpusched API to use; default: $GPUSCHED_URL "
        "(the server extension exports its own), else the running server found.",
    ).tag(config=True)
    token = Unicode(
        "", help="Token for `url`; default: $GPUSCHED_TOKEN, else $JUPYTERHUB_API_TOKEN."
    ).tag(config=True)
    start_timeout_s = Float(
        None,
        allow_none=True,
        help="Give up (and cancel the lease) when it has not started after this many seconds; "
        "None waits as long as the queue needs (the user can cancel).",
    ).tag(config=True)
    ready_timeout_s = Float(
        60.0, help="Seconds a started (or restarted) remote kernel has to answer."
    ).tag(config=True)
    watch_interval_s = Float(
        5.0, min=0.05, help="Seconds between checks of the lease and the kernel's heartbeat."
    ).tag(config=True)
    touch_interval_s = Float(
        30.0,
        min=0.0,
        help="Report the kernel's activity to its lease at most this often (seconds), so the "
        "policy's idle timeout reclaims only kernels nobody uses.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        quiet_not_started(kwargs.get("parent"))
        asked = {k: kwargs.pop(k) for k in list(kwargs) if k in FIELDS}
        unknown = [k for k in kwargs if not self.has_trait(k)]
        if unknown:
            raise InvalidSpecError(
                f"kernelspec.{unknown[0]}",
                f"unknown provisioner setting; use lease fields ({', '.join(FIELDS)})",
            )
        super().__init__(**kwargs)
        #: The kernelspec's request (the notebook's metadata may override it per start).
        self.spec_fields = lease_fields(asked, where="kernelspec")
        self._lease = KernelLease(self.url, self.token, self.log)
        self._request: dict[str, Any] = {}
        self._start: dict[str, Any] = {}  # what a re-lease needs: cwd, notebook
        self._wire: KernelWire | None = None
        self._pid: int | None = None
        self._attempt = -1
        self._exit: int | None = None
        self._restarting = False  # a restart was asked: the supervisor brings a new process
        self._moved = False  # same kernel, new forwarded ports (the scheduler restarted)
        self._shutdown = False
        self._refreshed_at = 0.0
        self._touched_at = 0.0
        self._seen_activity: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._cull: asyncio.Future[Any] | None = None

    # ------------------------------------------------------------------ the provisioner API

    @property
    def lease(self) -> JobView | None:
        """The kernel's lease as last seen."""
        return self._lease.job

    @property
    def has_process(self) -> bool:
        """Whether a lease's kernel is (or was last) this kernel's process."""
        return self.lease is not None and bool(self.connection_info)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Submit a lease (or keep the current one on a restart with the same request)."""
        kwargs = await super().pre_launch(**kwargs)
        env = kwargs["env"]
        notebook = env.get("JPY_SESSION_NAME") or None
        request = {**self.spec_fields, **notebook_fields(notebook)}
        self._exit, self._shutdown = None, False
        self._start = {"cwd": kwargs.get("cwd"), "notebook": notebook}
        if self._lease.ended or self._lease.released or request != self._request:
            # a lease given back (the kernel was shut down) is not started again
            await self._release("the notebook asks for other resources")
            self._request = request
            if not self._take_over_waiting():
                await self._submit()
        kwargs["cmd"] = self.parent.format_kernel_cmd(
            extra_arguments=kwargs.pop("extra_arguments", None)
        )
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Wait for the lease to run; the connection info of its (new) remote kernel."""
        try:
            return await self._launch()
        except GpuKernelNotStarted as exc:
            self.log.info("GPU kernel %s: %s", self.kernel_id, exc)
            self._forget_failed_start()
            raise
        except BaseException:
            await self._release("its kernel did not start")
            self._forget_failed_start()
            raise

    def _forget_failed_start(self) -> None:
        """Drop this kernel from its manager's pending starts.

        jupyter_client keeps a kernel whose first start failed among the pending ones for good;
        the server's shutdown then shuts it down, gets "404 Kernel does not exist" and goes no
        further: `jupyter lab` did not stop on one SIGTERM.
        """
        pending = getattr(getattr(self.parent, "parent", None), "_pending_kernels", None)
        if isinstance(pending, dict):
            pending.pop(self.kernel_id, None)

    async def post_launch(self, **kwargs: Any) -> None:
        """Watch the lease and the kernel from now on."""
        self._restarting = False
        self._stop_watcher()
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(), name=f"gpusched-kernel-{self.kernel_id}"
        )

    async def poll(self) -> int | None:
        """None while the kernel runs; else its exit status (a restarting one counts as gone)."""
        if self._restarting:
            return 0
        if self._exit is None and (self._shutdown or self._lease.released):
            await self._refresh(min_interval_s=0.2)
        return self._exit

    async def wait(self) -> int | None:
        """Until the kernel (its lease, or its process on a restart) is gone."""
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.1)
        return code

    async def send_signal(self, signum: int) -> None:
        """SIGINT interrupts (``interrupt_request``); TERM and KILL release; others are refused."""
        if signum == 0:
            return
        if signum == signal.SIGINT:
            if self._wire is not None:
                await self._wire.request("interrupt_request", timeout_s=5.0)
        elif signum in (signal.SIGTERM, signal.SIGKILL):
            await self.kill()
        else:
            self.log.warning(
                "GPU kernel %s: signal %d cannot reach a remote kernel; ignored",
                self.kernel_id,
                signum,
            )

    async def kill(self, restart: bool = False) -> None:
        """Release the lease; on a restart, have the kernel's supervisor replace the process."""
        if not restart:
            await self._release("its kernel was killed")
            return
        if self._wire is not None and not self._moved and self._exit is None:
            # the supervisor TERMs, then KILLs, a kernel that does not leave in time
            self._restarting = True
            await self._wire.request("shutdown_request", {"restart": True}, timeout_s=2.0)

    async def terminate(self, restart: bool = False) -> None:
        """As :meth:`kill`: the lease's cancel is already TERM, grace, KILL."""
        await self.kill(restart=restart)

    async def shutdown_requested(self, restart: bool = False) -> None:
        """The kernel was asked to shut down (its supervisor restarts it if ``restart``)."""
        if restart:
            self._restarting = not self._moved and self._exit is None
        else:
            self._shutdown = True

    async def cleanup(self, restart: bool = False) -> None:
        """Stop watching; unless restarting, release the lease."""
        self._stop_watcher()
        if restart:
            return
        await self._release("its kernel shut down")
        if self._wire is not None:
            self._wire.close()
        self._wire = None
        self.connection_info = {}

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Short: the lease's own cancel TERMs and KILLs a kernel that does not leave."""
        return min(recommended, 3.0)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """The base info plus the lease, for managers that persist kernels."""
        info = await super().get_provisioner_info()
        info.update(
            lease_id=self.lease.id if self.lease else None, request=self._request, pid=self._pid
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Take a kernel over from :meth:`get_provisioner_info`'s answer."""
        await super().load_provisioner_info(provisioner_info)
        self._request = dict(provisioner_info.get("request") or {})
        self._pid = provisioner_info.get("pid")
        if provisioner_info.get("lease_id") is not None:
            self._lease.job = await self._lease.call("get_job", provisioner_info["lease_id"])
            self._attempt = self._lease.job.attempt
            self._wire = KernelWire(self.connection_info)

    # ------------------------------------------------------------------ starting

    def _waiting_key(self) -> tuple[int, str] | None:
        notebook = self._start.get("notebook")
        return (id(getattr(self.parent, "parent", None)), str(notebook)) if notebook else None

    def _take_over_waiting(self) -> bool:
        """Take over the lease another kernel of this notebook waits for (a reloaded page).

        That kernel's start then ends (409, its page is gone) without releasing the lease.
        """
        key = self._waiting_key()
        other = _WAITING.get(key) if key else None
        if other is None or other is self or other._request != self._request:
            return False
        job = other._lease.job
        if job is None or other._lease.released or job.state is JobState.RUNNING:
            return False
        other._lease.handed_over_to = str(self.kernel_id)
        other._lease.released = True  # its failed start must not give the lease back
        self._lease.job, self._lease.released = job, False
        self.log.info(
            "GPU kernel %s: takes over lease %d, which kernel %s of the same notebook waited for",
            self.kernel_id,
            job.id,
            other.kernel_id,
        )
        return True

    async def _submit(self) -> None:
        notebook = self._start.get("notebook")
        name = str(self.kernel_spec.display_name if self.kernel_spec else "GPU kernel")
        labels = {KERNEL_LABEL: str(self.kernel_id)}
        lease_name = f"kernel-{self.kernel_id}"
        if notebook:
            # named after its notebook: the panel's and `%gpu status`'s notebook column
            labels[NOTEBOOK_LABEL] = os.path.basename(notebook)
            name = f"{os.path.basename(notebook)} · {name}"
            lease_name = f"{notebook[-190:]}:kernel"
        env = {k: str(v) for k, v in (self.kernel_spec.env if self.kernel_spec else {}).items()}
        if self._start.get("cwd"):
            env[KERNEL_CWD_ENV] = str(self._start["cwd"])
        body = {
            "kind": "lease",
            "lease_name": lease_name,
            "name": name[:200],
            "labels": labels,
            "env": env,
            **self._request,
        }
        job = await self._lease.submit(body)
        self._restarting = False  # a new lease runs a new kernel: nothing to wait out
        self.log.info("GPU kernel %s: lease %d requested", self.kernel_id, job.id)

    async def _launch(self) -> KernelConnectionInfo:
        restarting, moved, old_pid = self._restarting, self._moved, self._pid
        # only a first start may be taken over: a started kernel's session re-attaches as is
        key = self._waiting_key() if old_pid is None else None
        if key is not None:
            _WAITING[key] = self
        try:
            job = await self._lease.wait_running(
                timeout_s=self.start_timeout_s,
                on_wait=lambda line: self.log.info("GPU kernel %s: %s", self.kernel_id, line),
            )
        finally:
            if key is not None and _WAITING.get(key) is self:
                del _WAITING[key]
        answer = await self._lease.kernel(timeout_s=self.ready_timeout_s)
        info = connection_info(answer)
        wire = KernelWire(info)
        if restarting and not moved and old_pid:
            pid = await self._successor(wire, old_pid)
            if pid is None:
                self.log.warning(
                    "GPU kernel %s: lease %d's kernel did not restart; requesting a new lease",
                    self.kernel_id,
                    job.id,
                )
                await self._release("its kernel did not restart")
                await self._submit()
                return await self._launch()
        else:
            pid = await self._answering(wire, job.id)
            # idle time counts from the kernel's first answer, not from the lease's grant
            answer = await self._lease.kernel(timeout_s=self.ready_timeout_s)
            if connection_info(answer) != info:  # forwarded again meanwhile
                info, wire = connection_info(answer), KernelWire(connection_info(answer))
            self.log.info("GPU kernel %s: ready %s", self.kernel_id, placed_text(job))
        if self._wire is not None:
            self._wire.close()
        self._wire, self._pid, self._attempt = wire, pid, job.attempt
        self._moved = False
        self.connection_info = info
        self._touched_at = time.monotonic()  # reading the kernel counted as activity
        return info

    async def _answering(self, wire: KernelWire, lease_id: int) -> int:
        """The kernel's pid once it answers on its control channel."""
        deadline = time.monotonic() + self.ready_timeout_s
        while (pid := await wire.kernel_pid(timeout_s=1.0)) is None:
            if time.monotonic() > deadline:
                raise GpuKernelError(
                    f"GPU kernel not answering: lease {lease_id}'s kernel did not answer in "
                    f"{format_duration_s(self.ready_timeout_s)}"
                )
        return pid

    async def _successor(self, wire: KernelWire, old_pid: int) -> int | None:
        """The restarted kernel's pid; None if it did not come (then the lease is re-taken)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            pid = await wire.kernel_pid(timeout_s=1.0)
            if pid is not None and pid != old_pid:
                return pid
            if pid is None:  # nobody answered: is the lease still there?
                if (await self._lease.refresh()).state is not JobState.RUNNING:
                    return None
            else:
                await asyncio.sleep(0.05)  # the old kernel is still leaving
        return None

    # ------------------------------------------------------------------ watching

    async def _watch(self) -> None:
        while self._exit is None:
            await asyncio.sleep(self.watch_interval_s)
            try:
                await self._watch_once()
            except (GpuSchedError, GpuKernelError) as exc:
                # the server is unreachable, or the lease ended since it was read: look again
                self.log.warning("GPU kernel %s: cannot check its lease: %s", self.kernel_id, exc)

    async def _watch_once(self) -> None:
        assert self._wire is not None
        job = await self._lease.refresh()
        if job.state in TERMINAL_STATES:
            self._ended(job)
            return
        if job.state is not JobState.RUNNING or job.attempt != self._attempt:
            self.log.warning(
                "GPU kernel %s: lease %d lost its kernel (%s); it restarts once the lease "
                "runs again",
                self.kernel_id,
                job.id,
                job.reason or job.state.value,
            )
            self._exit = 1
            return
        if not await self._wire.beat():
            self.log.warning(
                "GPU kernel %s: no heartbeat; asking for its ports again", self.kernel_id
            )
            await self._reforward()
        elif self._active():
            await self._reforward()

    async def _reforward(self) -> None:
        """Ask for the kernel again (activity; forwards again if they dropped)."""
        answer = await self._lease.kernel(timeout_s=self.ready_timeout_s)
        self._touched_at = time.monotonic()
        if connection_info(answer) != self.connection_info:
            # same kernel, new local ports (the scheduler restarted): reconnect by a restart
            self.log.warning(
                "GPU kernel %s: its ports moved; reconnecting (the kernel keeps its state)",
                self.kernel_id,
            )
            self._moved = True
            self._exit = 1

    def _active(self) -> bool:
        """Whether to report activity now: used since the last report, and due."""
        if time.monotonic() - self._touched_at < self.touch_interval_s:
            return False
        km = self.parent
        last = getattr(km, "last_activity", None)
        if last is None:  # not a Jupyter server's manager: the kernel is in use while it lives
            return True
        busy = getattr(km, "execution_state", None) == "busy"
        used = self._seen_activity is None or last > self._seen_activity
        self._seen_activity = last
        return busy or used

    def _ended(self, job: JobView) -> None:
        """The lease ended under the kernel: cull it, or report it dead if it died by itself."""
        self._exit = exit_status(job)
        why = job.reason or job.state.value
        if not job.handle.get("stopping"):
            self.log.warning("GPU kernel %s: ended by itself (%s)", self.kernel_id, why)
            return  # Jupyter's restarter starts it again, on a new lease
        self.log.warning(
            "GPU kernel %s: lease %d ended (%s); shutting the kernel down",
            self.kernel_id,
            job.id,
            why,
        )
        manager = getattr(self.parent, "parent", None)
        if not hasattr(manager, "shutdown_kernel") or self.kernel_id not in manager:
            return
        with contextlib.suppress(Exception):
            self.parent.stop_restarter()
        done = manager.shutdown_kernel(self.kernel_id)
        if inspect.isawaitable(done):
            self._cull = asyncio.ensure_future(done)

    def _stop_watcher(self) -> None:
        if self._watcher is not None and self._watcher is not _current_task():
            self._watcher.cancel()
        self._watcher = None

    # ------------------------------------------------------------------ the lease's end

    async def _release(self, why: str) -> None:
        await self._lease.release(why)
        if self._lease.released and self.lease is not None and self._lease.ended:
            self._exit = exit_status(self.lease)

    async def _refresh(self, *, min_interval_s: float) -> None:
        if self.lease is None or time.monotonic() - self._refreshed_at < min_interval_s:
            return
        self._refreshed_at = time.monotonic()
        with contextlib.suppress(GpuSchedError):
            await self._lease.refresh()
        if self._lease.ended:
            self._exit = exit_status(self._lease.job)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
