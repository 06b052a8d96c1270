"""The ipykernel a lease runs: IPython's, plus two things a remote kernel's manager needs.

- ``kernel_info_reply`` carries ``gpusched.pid``: the manager in the user's Jupyter server sees
  the kernel only through forwarded ports, and after a restart it tells the new kernel from
  the old one by this pid.
- A ``shutdown_request`` without restart tells the supervisor the end is a clean one.
- A ``shutdown_request`` with ``restart: true`` tells the lease's supervisor
  (:mod:`.supervisor`) to start the kernel again once it has exited, so a restart keeps the
  lease and its GPUs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from .supervisor import RESTART_SIGNAL, SHUTDOWN_SIGNAL, SUPERVISOR_ENV


class LeaseKernel(IPythonKernel):
    """An IPython kernel that says its pid and restarts in place under its supervisor."""

    @property
    def kernel_info(self) -> dict[str, Any]:  # noqa: D102
        return {**super().kernel_info, "gpusched": {"pid": os.getpid()}}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:  # noqa: D102
        _tell_supervisor(RESTART_SIGNAL if restart else SHUTDOWN_SIGNAL)
        return super().do_shutdown(restart)


def _tell_supervisor(signum: int) -> None:
    """Signal the supervisor, if this kernel runs under one (it is our parent)."""
    with contextlib.suppress(ValueError, OSError):
        pid = int(os.environ.get(SUPERVISOR_ENV, ""))
        if pid == os.getppid():
            os.kill(pid, signum)
