"""A GPU kernel's lease, through the gpusched REST API: submit, wait, reach, release.

The provisioner (:mod:`.provisioner`) runs on the event loop of a Jupyter server, which may
serve the very API it calls; the REST client blocks, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.multikernelmanager import DuplicateKernelError

from jupyter_gpusched.core.api import JobView, LeaseKernel
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.models import TERMINAL_STATES, JobState
from jupyter_gpusched.core.units import format_duration_s

from .api import TOKEN_ENV, URL_ENV, ApiError, GpuSchedClient, find_server


class GpuKernelError(RuntimeError):
    """The GPU kernel could not start; the message says why and what to do."""


class GpuKernelNotStarted(GpuKernelError, DuplicateKernelError):
    """The start ended on purpose: its lease was cancelled, or a reloaded page took it over.

    Not a server fault: Jupyter's sessions API answers it 409 (its ``DuplicateKernelError``
    branch) with this message, not a 500 with a traceback in the log.
    """


class _NotStartedIsNoError(logging.Filter):
    """A start ended on purpose (cancelled, taken over) is an info line, not a traceback.

    jupyter_client's kernel manager logs every failed start as an error with its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else record.msg
        if isinstance(exc, GpuKernelNotStarted):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args, record.exc_info, record.exc_text = str(exc), (), None, None
        return True


_FILTER = _NotStartedIsNoError()


def quiet_not_started(manager: Any) -> None:
    """Put :class:`_NotStartedIsNoError` on the kernel manager's logger (once)."""
    log = getattr(manager, "log", None)
    target = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if isinstance(target, logging.Logger) and _FILTER not in target.filters:
        target.addFilter(_FILTER)


class KernelLease:
    """One lease at a time of one GPU kernel (a restart may take a new one).

    Parameters
    ----------
    url, token
        The server whose gpusched API to use; empty: ``$GPUSCHED_URL`` / ``$GPUSCHED_TOKEN``
        (the server extension exports its own), the Hub token, else the server found.
    log
        Where waiting and releasing are told.
    """

    def __init__(self, url: str, token: str, log: logging.Logger | logging.LoggerAdapter[Any]):
        self.url = url
        self.token = token
        self.log = log
        #: The lease as last seen (None before the first submit).
        self.job: JobView | None = None
        #: Whether this side released it (a release is sent once).
        self.released = False
        #: Set when another kernel took this waiting lease over (a reloaded page's).
        self.handed_over_to: str | None = None
        self._api: GpuSchedClient | None = None

    @property
    def ended(self) -> bool:
        """Whether the lease is over (or there is none)."""
        return self.job is None or self.job.state in TERMINAL_STATES

    async def call(self, method: str, *args: Any) -> Any:
        """A REST call in a worker thread: the API may be served by this very event loop."""
        return await asyncio.to_thread(lambda: getattr(self._client(), method)(*args))

    async def submit(self, body: dict[str, Any]) -> JobView:
        """Request a lease; a refusal (it can never fit, bad fields) fails the start."""
        try:
            self.job = await self.call("submit", body)
        except GpuSchedError as exc:
            raise GpuKernelError(f"no GPU kernel: {exc.message}") from None
        self.released = False
        return self.job

    async def refresh(self) -> JobView:
        """The lease now."""
        assert self.job is not None
        self.job = await self.call("get_job", self.job.id)
        return self.job

    async def wait_running(
        self, *, timeout_s: float | None, on_wait: Callable[[str], None]
    ) -> JobView:
        """The lease once it runs; ``on_wait`` hears where it stands whenever that changes.

        Fails (:class:`GpuKernelError`) when the lease ends first, e.g. cancelled by its
        owner, or has not started after ``timeout_s`` (then it is released).
        """
        started = time.monotonic()
        delay_s, shown = 0.02, ""
        while True:
            job = await self.refresh()
            if self.handed_over_to is not None:
                raise GpuKernelNotStarted(
                    f"GPU kernel not started here: kernel {self.handed_over_to} took over "
                    f"lease {job.id} (its notebook was opened again)"
                )
            if job.state is JobState.RUNNING:
                return job
            if job.state is JobState.CANCELLED:
                why = job.reason if (job.reason or "").startswith("cancelled") else None
                raise GpuKernelNotStarted(
                    f"GPU kernel not started: lease {job.id} "
                    + (why or f"cancelled ({job.reason or 'by its owner'})")
                )
            if job.state in TERMINAL_STATES:
                raise GpuKernelError(
                    f"GPU kernel not started: lease {job.id} {job.state.value} "
                    f"({job.reason or 'no reason given'})"
                )
            if (line := waiting_text(job)) != shown:
                on_wait(line)
                shown = line
            waited_s = time.monotonic() - started
            if timeout_s is not None and waited_s > timeout_s:
                await self.release("it did not start in time")
                raise GpuKernelError(
                    f"GPU kernel not started: lease {job.id} still {job.state.value} after "
                    f"{format_duration_s(round(waited_s))}; it was cancelled (ask for fewer "
                    "GPUs, or raise GpuLeaseProvisioner.start_timeout_s)"
                )
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 1.5, 1.0)

    async def kernel(self, *, timeout_s: float) -> LeaseKernel:
        """``GET leases/{id}/kernel`` (counts as activity), retried while it is starting."""
        assert self.job is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer: LeaseKernel = await self.call("lease_kernel", self.job.id)
                self.job = answer.lease
                return answer
            except ApiError as exc:
                # 409: launched but not recorded yet; 502: its node is unreachable for now
                if exc.status not in (409, 502) or "has ended" in exc.message:
                    raise GpuKernelError(f"GPU kernel not reachable: {exc.message}") from None
                if time.monotonic() > deadline:
                    raise GpuKernelError(f"GPU kernel not reachable: {exc.message}") from None
            await asyncio.sleep(0.05)

    async def release(self, why: str) -> None:
        """Give the lease back (once; quietly when it ended already or the server is gone)."""
        job = self.job
        if job is None or self.released or job.state in TERMINAL_STATES:
            return
        self.released = True
        try:
            self.job = await self.call("release", job.id)
        except ApiError as exc:
            if exc.status not in (404, 409):  # 409: it had ended already
                self.log.warning("GPU kernel: releasing lease %d failed: %s", job.id, exc)
            return
        except GpuSchedError as exc:  # the server is gone: the idle timeout will reclaim it
            self.log.warning("GPU kernel: releasing lease %d failed: %s", job.id, exc)
            return
        self.log.info("GPU kernel: released lease %d (%s)", job.id, why)

    def _client(self) -> GpuSchedClient:
        if self._api is None:
            url = self.url or os.environ.get(URL_ENV, "")
            token = (
                self.token
                or os.environ.get(TOKEN_ENV, "")
                or os.environ.get("JUPYTERHUB_API_TOKEN", "")
            )
            info = find_server(url or None, token or None)
            # a lease kernel's first answer may wait for the kernel to write its ports
            self._api = GpuSchedClient(info.url, info.token, timeout_s=90.0)
        return self._api


def connection_info(answer: LeaseKernel) -> KernelConnectionInfo:
    """The lease kernel's connection as a kernel manager holds it (the key as bytes)."""
    info: dict[str, Any] = answer.connection.model_dump()
    info["key"] = str(info["key"]).encode()
    return info


def exit_status(job: JobView) -> int:
    """The exit status a kernel manager reads from an ended lease."""
    if job.exit_code is not None:
        return job.exit_code
    return -signal.SIGTERM if job.state is JobState.CANCELLED else 1


def placed_text(job: JobView) -> str:
    """Where a running lease is, e.g. ``on a100-0 GPU 2`` or ``on g0 GPUs 0,1``."""
    if job.placement is None:
        return f"(lease {job.id})"
    gpus = job.placement.gpu_indices
    label = "GPU" if len(gpus) == 1 else "GPUs"
    return f"on {job.placement.node} {label} {','.join(map(str, gpus))} (lease {job.id})"


def waiting_text(job: JobView) -> str:
    """Where a waiting lease stands, in one line (the server log shows it)."""
    parts = [f"lease {job.id} {job.state.value}"]
    if job.state is JobState.QUEUED and job.position:
        parts.append(f"#{job.position} in the queue")
    if job.estimated_start is not None:
        parts.append(f"expected to start {job.estimated_start.isoformat(timespec='minutes')}")
    if job.reason:
        parts.append(job.reason)
    return ", ".join(parts)
