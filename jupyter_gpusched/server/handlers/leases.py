"""``GET gpusched/api/leases/{id}/kernel``: how the lease's owner reaches its remote kernel.

Answers the local connection info of the kernel (ports forwarded to this server's loopback by
:class:`~jupyter_gpusched.leases.bridge.KernelBridge`) and the lease. Only the owner (or an admin)
may read it: the session key in it lets the reader run code as the lease's owner. Every read
counts as activity on the lease, postponing its idle reclaim.
"""

from __future__ import annotations

import re

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpusched.core.api import KernelConnection, LeaseKernel
from jupyter_gpusched.core.errors import ConflictError, ForbiddenError, NotFoundError
from jupyter_gpusched.core.models import TERMINAL_STATES, JobKind, JobState
from jupyter_gpusched.leases.bridge import bridge_for

from .base import API, ApiHandler


def _lease_id(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise NotFoundError(f"lease {text} does not exist; list yours with GET gpusched/api/leases")
    return int(text)


class LeaseKernelHandler(ApiHandler):
    """The connection info of a running lease's kernel."""

    @web.authenticated
    @authorized
    async def get(self, lease_id: str) -> None:
        """``{"connection": {...}, "lease": Job, "generation": n}``; 409 until it runs."""
        sched = await self.scheduler()
        job = sched.get_job(_lease_id(lease_id))
        if job.spec.kind is not JobKind.LEASE:
            raise NotFoundError(f"job {job.id} is a {job.spec.kind.value} job, not a lease")
        if job.user != self.username and not self.is_admin():
            raise ForbiddenError(
                f"lease {job.id} belongs to {job.user}; only its owner may use its kernel"
            )
        if job.state in TERMINAL_STATES:
            why = f" ({job.reason})" if job.reason else ""
            raise ConflictError(
                f"lease {job.id} has ended: {job.state.value}{why}; request a new lease"
            )
        if job.state is not JobState.RUNNING:
            why = f": {job.reason}" if job.reason else ""
            raise ConflictError(
                f"lease {job.id} is {job.state.value}{why}; its kernel is not running yet"
            )
        connection, generation = await bridge_for(sched).connection(job)
        job = sched.touch(job.id)
        self.write_model(
            LeaseKernel(
                connection=KernelConnection(**connection),
                lease=sched.job_view(job, self.viewer),
                generation=generation,
            )
        )


handlers: list[tuple[str, type]] = [
    (rf"{API}/leases/([^/]+)/kernel", LeaseKernelHandler),
]
