"""The leases a kernel's ``%%gpu`` cells run on, and the kernel clients connected to them.

A :class:`LeaseKeeper` acquires (or reuses, or adopts after a restart of the local kernel) one
lease per name, waits with one updating line while it is queued, connects a jupyter_client
:class:`~jupyter_client.BlockingKernelClient` to the ports the server forwards, and runs cells
there (:func:`~jupyter_gpusched.client.remote.run_remote`). Failures the user should read are
:class:`~IPython.core.error.UsageError`: one line, no traceback.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from jupyter_gpusched.core.api import JobView, LeaseKernel, Window
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.models import TERMINAL_STATES, JobState

from .api import ApiError, GpuSchedClient, ServerInfo, find_server, running_servers
from .lines import mismatch, plain, running_line, waiting_line
from .remote import StopWaiting, beating, run_remote


class LeaseGone(Exception):
    """The lease ended under a cell; ``started`` says whether the kernel had begun it."""

    def __init__(self, started: bool, why: str) -> None:
        super().__init__(why)
        self.started = started
        self.why = why


def discover(runtime_dir: str | None = None, parent_pids: set[int] | None = None) -> ServerInfo:
    """The server this kernel belongs to.

    ``$GPUSCHED_URL`` first (the extension exports it); else the running-server file of the
    kernel's parent server (``JPY_PARENT_PID`` or the parent process); else any server that
    answers our API (:func:`~jupyter_gpusched.client.api.find_server`).
    """
    if os.environ.get("GPUSCHED_URL"):
        return find_server()
    if parent_pids is None:
        parent_pids = {os.getppid()}
        with contextlib.suppress(ValueError):
            parent_pids.add(int(os.environ.get("JPY_PARENT_PID", "")))
    for info in running_servers(runtime_dir):
        if info.get("pid") in parent_pids:
            return ServerInfo(str(info["url"]), str(info.get("token", "")))
    return find_server(runtime_dir=runtime_dir)


def session_name() -> str:
    """The notebook's name for its leases (the kernel's id when the notebook is unknown)."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    if name:
        return name[-150:]
    with contextlib.suppress(Exception):
        from ipykernel.kernelapp import IPKernelApp

        if IPKernelApp.initialized():
            conn = os.path.basename(IPKernelApp.instance().connection_file)
            return conn.removesuffix(".json")[-150:]
    return f"pid-{os.getpid()}"


@dataclass
class Lease:
    """A lease this kernel uses, and the client connected to its remote kernel."""

    name: str
    job: JobView
    kc: Any = None
    generation: int = 0
    connection: dict[str, Any] = field(default_factory=dict)
    touched_at: float = 0.0
    stale: bool = False  # the server forwarded again: reconnect before the next cell
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def job_id(self) -> int:
        """The lease's job id."""
        return self.job.id


class LeaseKeeper:
    """A kernel's leases by name, on the server ``client()`` talks to."""

    touch_interval_s = 30.0

    def __init__(self, client: Callable[[], GpuSchedClient], session: str) -> None:
        self._client = client
        self.session = session
        self.leases: dict[str, Lease] = {}

    @property
    def client(self) -> GpuSchedClient:
        """The REST client (found on first use)."""
        return self._client()

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)``, a refusal by the server becoming one line (naming the option)."""
        try:
            return fn(*args, **kw)
        except GpuSchedError as exc:
            raise UsageError(plain(exc)) from None

    def full_name(self, name: str) -> str:
        """The server-side lease name: this notebook's, then the user's."""
        return f"{self.session}:{name}"

    # -- running a cell -----------------------------------------------------------------------

    def run_cell(
        self,
        code: str,
        name: str,
        spec: dict[str, Any],
        timeout_s: float | None,
        *,
        asked: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``code`` in the lease's remote kernel, relaying its outputs into this cell.

        ``asked``: the request fields the cell gave; a lease already held that differs from
        them is not used silently (:func:`mismatch`).
        """
        lease = self.acquire(name, spec, timeout_s, asked=asked)
        with lease.lock:
            self.touch_soon(lease)
            try:
                return self._execute(lease, code)
            except LeaseGone as gone:
                if gone.started:
                    raise UsageError(
                        f"lease {lease.job_id} ended while the cell ran: {gone.why}"
                    ) from None
                # the cell never reached the kernel: run it on a new lease
                print(
                    f"%gpu: lease {lease.job_id} ended ({gone.why}); requesting a new one "
                    "(variables set on it are gone)"
                )
        lease = self.acquire(name, spec, timeout_s)
        with lease.lock:
            return self._execute(lease, code)

    def acquire(
        self,
        name: str,
        spec: dict[str, Any],
        timeout_s: float | None,
        *,
        asked: dict[str, Any] | None = None,
    ) -> Lease:
        """A lease with a connected kernel client: the cached one, adopted, or a new one."""
        full = self.full_name(name)
        lease = self.leases.get(full)
        if lease is not None and (differs := mismatch(lease.job, asked or {}, name)):
            raise UsageError(differs)
        if lease is not None and lease.kc is not None and not lease.stale:
            if beating(lease.kc):
                return lease
        if lease is not None and self._refresh(lease) == "ended":
            self.forget(lease)
            why = lease.job.reason or lease.job.state.value
            print(
                f"%gpu: lease {lease.job_id} ended ({why}); requesting a new one "
                "(variables set on it are gone)"
            )
            lease = None
        if lease is None:
            lease = self.adopt(full)
            if lease is not None and (differs := mismatch(lease.job, asked or {}, name)):
                raise UsageError(differs)
            lease = lease or self._request(full, name, spec)
            self.leases[full] = lease
        while lease.kc is None or lease.stale:  # new, or requeued after its node was lost
            self._wait_running(lease, timeout_s)
            state = self._refresh(lease)
            if state == "ended":
                self.forget(lease)
                raise UsageError(
                    f"lease {lease.job_id} {lease.job.state.value}: {lease.job.reason}"
                )
            if state == "waiting":
                time.sleep(0.2)
        return lease

    def adopt(self, full_name: str) -> Lease | None:
        """A live lease of that name the server already has (this kernel restarted)."""
        for job in self.call(self.client.leases):
            if job.spec.lease_name == full_name and job.state not in TERMINAL_STATES:
                return Lease(full_name, job)
        return None

    def _request(self, full_name: str, name: str, spec: dict[str, Any]) -> Lease:
        body = {
            "kind": "lease",
            "lease_name": full_name,
            "name": f"%%gpu {name}",
            "env": {"GPUSCHED_KERNEL_CWD": os.getcwd()},
            **spec,
        }
        return Lease(full_name, self.call(self.client.submit, body))

    def _refresh(self, lease: Lease) -> str:
        """Ask the server about the lease (marks activity): ``ok``, ``waiting`` or ``ended``.

        Reconnects the kernel client when the server forwarded the ports again.
        """
        try:
            answer = self.client.lease_kernel(lease.job_id)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise UsageError(exc.message) from None
            if exc.status == 404:
                update = {"state": JobState.CANCELLED, "reason": exc.message}
                lease.job = lease.job.model_copy(update=update)
                return "ended"
            lease.job = self.call(self.client.get_job, lease.job_id)
            if lease.job.state in TERMINAL_STATES:
                return "ended"
            lease.stale = True  # a new kernel will start: connect again once it runs
            return "waiting"
        except GpuSchedError as exc:
            raise UsageError(exc.message) from None
        lease.job = answer.lease
        lease.touched_at = time.monotonic()
        if lease.kc is None or lease.stale or moved(lease, answer):
            self._open_client(lease, answer)
        return "ok"

    def forget(self, lease: Lease) -> None:
        """Drop the lease from this kernel and close its client."""
        self.leases.pop(lease.name, None)
        if lease.kc is not None:
            with contextlib.suppress(Exception):
                lease.kc.stop_channels()
            lease.kc = None

    def _wait_running(self, lease: Lease, timeout_s: float | None) -> None:
        """Wait with one updating line saying why; Ctrl-C or timeout gives the lease back."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        handle = None
        shown = ""
        window: Window | None = None
        window_at = float("-inf")
        try:
            while True:
                job = lease.job
                if job.state is JobState.RUNNING:
                    break
                if job.state in TERMINAL_STATES:
                    self.leases.pop(lease.name, None)
                    raise UsageError(
                        f"lease {lease.job_id} {job.state.value}: {job.reason or 'no reason'}"
                    )
                if time.monotonic() - window_at > 10:
                    with contextlib.suppress(GpuSchedError):
                        window = self.client.cluster().window
                    window_at = time.monotonic()
                text = waiting_line(job, window)
                if text != shown:
                    if handle is None:
                        handle = display({"text/plain": text}, raw=True, display_id=True)
                    else:
                        handle.update({"text/plain": text}, raw=True)
                    shown = text
                if deadline is not None and time.monotonic() > deadline:
                    self.give_back(lease)
                    raise UsageError(f"lease {lease.job_id} did not start in time; cancelled")
                time.sleep(0.2)
                lease.job = self.call(self.client.get_job, lease.job_id)
        except KeyboardInterrupt:
            self.give_back(lease)
            raise UsageError(f"interrupted; lease {lease.job_id} was cancelled") from None
        if handle is not None:
            handle.update({"text/plain": running_line(lease.job)}, raw=True)

    def give_back(self, lease: Lease) -> None:
        """Forget the lease and release it (quietly: it may have ended already)."""
        self.forget(lease)
        with contextlib.suppress(GpuSchedError):
            self.client.release(lease.job_id)

    def _open_client(self, lease: Lease, answer: LeaseKernel) -> None:
        from jupyter_client import BlockingKernelClient

        if lease.kc is not None:
            with contextlib.suppress(Exception):
                lease.kc.stop_channels()
        connection = answer.connection.model_dump()
        kc = BlockingKernelClient()
        kc.load_connection_info(connection)
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
        except RuntimeError as exc:
            kc.stop_channels()
            raise UsageError(f"the kernel of lease {lease.job_id} does not answer: {exc}") from None
        lease.kc = kc
        lease.generation = answer.generation
        lease.connection = connection
        lease.stale = False

    def touch_soon(self, lease: Lease) -> None:
        """Report activity in the background, at most every ``touch_interval_s``."""
        if time.monotonic() - lease.touched_at < self.touch_interval_s:
            return
        lease.touched_at = time.monotonic()
        client = self.client

        def touch() -> None:
            try:
                answer = client.lease_kernel(lease.job_id)
            except GpuSchedError:
                return  # the next cell finds out what happened
            if moved(lease, answer):
                lease.stale = True

        threading.Thread(target=touch, name="gpusched-touch", daemon=True).start()

    def _execute(self, lease: Lease, code: str) -> Any:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        try:
            return run_remote(
                lease.kc,
                code,
                allow_stdin=bool(getattr(kernel, "_allow_stdin", False)),
                tick=lambda: self.touch_soon(lease),  # a long cell is activity too
                silent=lambda started: self._lost_while_running(lease, started),
            )
        except StopWaiting:
            raise UsageError(
                f"stopped waiting; the cell may still run on lease {lease.job_id} "
                "(%gpu release ends it)"
            ) from None

    def _lost_while_running(self, lease: Lease, started: bool) -> None:
        """The kernel stopped answering: did the lease end or the forwards drop."""
        job = self.call(self.client.get_job, lease.job_id)
        lease.job = job
        if job.state in TERMINAL_STATES:
            self.forget(lease)
            raise LeaseGone(started, job.reason or job.state.value)
        try:
            answer = self.client.lease_kernel(lease.job_id)
        except GpuSchedError:
            return  # node unreachable for now: keep waiting
        if answer.connection.model_dump() != lease.connection:  # new ports: this client is lost
            lease.stale = True
            raise UsageError(
                f"lost the kernel of lease {lease.job_id} while the cell ran (the server "
                "restarted?); the next cell reconnects"
            )
        if answer.generation != lease.generation:
            lease.stale = True  # same ports, forwarded again: ZMQ reconnects by itself

    # -- releasing ----------------------------------------------------------------------------

    def release(self, names: list[str]) -> list[int]:
        """Release the leases of these (short) names; the ids released."""
        released = []
        for name in names:
            full = self.full_name(name) if ":" not in name else name
            lease = self.leases.get(full) or self.adopt(full)
            if lease is None:
                continue
            # no shutdown_request first: the kernel could exit 0 before the release arrives
            # and the lease would end as "succeeded"; the release TERMs its process group
            self.forget(lease)
            try:
                self.client.release(lease.job_id)
            except ApiError as exc:
                if exc.status != 409:  # 409: it had ended already
                    raise UsageError(exc.message) from None
            released.append(lease.job_id)
        return released

    def release_all(self) -> None:
        """Give back every lease of this kernel (kernel shutdown)."""
        for lease in list(self.leases.values()):
            self.give_back(lease)


def moved(lease: Lease, answer: LeaseKernel) -> bool:
    """Whether the server forwarded the kernel again (reconnect), or anew (after a restart)."""
    return answer.generation != lease.generation or answer.connection.model_dump() != (
        lease.connection
    )
