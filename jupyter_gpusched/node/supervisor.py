"""A lease kernel's supervisor: restarts the ipykernel inside the lease, on the same ports.

A lease *is* its kernel's process group: when the ipykernel exits, the lease ends. A notebook's
"Restart kernel" must not give the GPUs back, so the lease runs this supervisor, which runs the
ipykernel as its child (same process group, so cancelling the lease stops both) and starts it
again when the kernel asked for a restart. The kernel (:mod:`.lease_ipykernel`) asks by sending
:data:`RESTART_SIGNAL` to the pid in :data:`SUPERVISOR_ENV` when it gets a ``shutdown_request``
with ``restart: true``. The new kernel reads the same connection file, so it binds the same
ports with the same keys and the server's forwards stay valid.

A kernel asked to shut down sends :data:`SHUTDOWN_SIGNAL` first: if it then dies of a signal
while tearing down (ipykernel can abort in zmq's teardown on a loaded machine), it still shut
down as asked, and the supervisor ends with 0. Any other end of the kernel (a crash, a
signal) ends the supervisor with the kernel's status, so the lease ends as the kernel did.
Standard library only: it runs on GPU nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

#: The signal a kernel sends its supervisor to be started again once it has exited.
RESTART_SIGNAL = signal.SIGUSR1
#: The signal a kernel sends its supervisor when asked to shut down for good.
SHUTDOWN_SIGNAL = signal.SIGUSR2
#: Environment variable holding the supervisor's pid, for the kernel to signal.
SUPERVISOR_ENV = "GPUSCHED_KERNEL_SUPERVISOR"


def supervise(argv: list[str], *, exit_grace_s: float = 5.0, kill_after_s: float = 3.0) -> int:
    """Run ``argv`` (an ipykernel), again after each restart request; its exit status.

    A kernel that asked for a restart or a shutdown but is still alive ``exit_grace_s`` later
    (a cell that ignores interrupts, a teardown that hangs) gets SIGTERM, then SIGKILL
    ``kill_after_s`` after that. The status is as :mod:`subprocess` gives it: ``-N`` when the
    kernel died of signal ``N``.
    """
    asked: list[float] = []
    stopping: list[int] = []
    shut_down: list[float] = []
    child: subprocess.Popen[bytes] | None = None

    def on_restart(_signum: int, _frame: Any) -> None:
        asked.append(time.monotonic())

    def on_stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(RESTART_SIGNAL, on_restart)
    signal.signal(SHUTDOWN_SIGNAL, lambda _s, _f: shut_down.append(time.monotonic()))
    # The kernel interrupts itself; a SIGINT sent to the whole group is for it, not for us.
    signal.signal(signal.SIGINT, lambda _s, _f: None)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    while True:
        asked.clear()
        child = subprocess.Popen(argv, env=env)
        code = _wait(child, asked, shut_down, exit_grace_s, kill_after_s)
        if shut_down and not stopping and code < 0:
            return 0  # it was shutting down as asked when its teardown died
        if not asked or stopping:
            return code


def _wait(
    child: subprocess.Popen[bytes],
    asked: list[float],
    shut_down: list[float],
    grace_s: float,
    kill_after_s: float,
) -> int:
    """The child's exit status, hurrying it along once it said it is ending.

    A kernel that was asked to restart or to shut down and hangs in its teardown (zmq's, on a
    loaded machine) would otherwise hold the lease, and its GPUs, for ever.
    """
    sent: set[int] = set()
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        said = asked or shut_down
        if not said:
            continue
        late_s = time.monotonic() - said[0]
        if late_s > grace_s + kill_after_s and signal.SIGKILL not in sent:
            child.kill()
            sent.add(signal.SIGKILL)
        elif late_s > grace_s and signal.SIGTERM not in sent:
            child.terminate()
            sent.add(signal.SIGTERM)


def exit_like(code: int) -> int:
    """Leave as the kernel left: killed by its signal, or with its exit code."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # the signal arrives; not reached for fatal ones
        return 128 - code
    return code
