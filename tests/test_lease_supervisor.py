"""The lease kernel under its supervisor, run here as the agent runs it on a node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import scaled
from jupyter_client import BlockingKernelClient

from jupyter_gpusched.node.kernel import PORT_KEYS, wait_connection

pytestmark = pytest.mark.slow


class LeaseKernel:
    """``python -m jupyter_gpusched.node.kernel kernel`` in its own process group."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "kernel-1.0.json"
        env = {k: v for k, v in os.environ.items() if k != "JPY_PARENT_PID"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpusched.node.kernel", "kernel",
             "--connection-file", str(self.path)],
            cwd=tmp_path, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.kc = BlockingKernelClient()
        try:
            self.info = wait_connection(str(self.path), scaled(30))
            self.kc.load_connection_info(self.info)
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=scaled(30))
        except BaseException:
            self.stop()  # never a kernel left behind, nor its Popen unwaited
            raise

    def control(
        self, msg_type: str, content: dict[str, Any] | None = None, timeout_s: float = 30
    ) -> dict[str, Any]:
        msg = self.kc.session.msg(msg_type, content or {})
        self.kc.control_channel.send(msg)
        while True:
            reply = self.kc.control_channel.get_msg(timeout=timeout_s)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])

    def pid(self, timeout_s: float = 30) -> int:
        return int(self.control("kernel_info_request", timeout_s=timeout_s)["gpusched"]["pid"])

    def run(self, code: str) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        self.kc.execute_interactive(code, output_hook=hook, timeout=scaled(30))
        return "".join(out)

    def stop(self) -> None:
        self.kc.stop_channels()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[LeaseKernel]:
    k = LeaseKernel(tmp_path)
    yield k
    k.stop()


def test_a_restart_request_brings_a_new_kernel_on_the_same_ports_in_the_same_lease(
    kernel: LeaseKernel,
) -> None:
    first = kernel.pid()
    assert first != kernel.proc.pid  # the supervisor is the lease's process, the kernel its child
    kernel.run("x = 41")
    assert kernel.control("shutdown_request", {"restart": True})["restart"] is True
    second = first
    while second == first:
        try:
            second = kernel.pid(timeout_s=1)
        except Exception:  # noqa: BLE001 - the old kernel left before it answered
            continue
    kernel.kc.wait_for_ready(timeout=scaled(30))
    assert kernel.run("print('x' in dir())") == "False\n"
    assert kernel.proc.poll() is None
    assert wait_connection(str(kernel.path), 1) == kernel.info  # same ports, same keys
    assert len({kernel.info[k] for k in PORT_KEYS}) == 5


@pytest.mark.parametrize(
    ("end", "status"),
    [
        ("shutdown", 0),  # a shutdown without restart ends the lease
        ("exit 3", 3),  # a crash ends it with the kernel's status (Jupyter restarts it anew)
        ("TERM", -signal.SIGTERM),  # cancelling the lease TERMs the group: both go
    ],
)
def test_any_other_end_of_the_kernel_ends_the_supervisor_as_the_kernel_ended(
    kernel: LeaseKernel, end: str, status: int
) -> None:
    if end == "shutdown":
        kernel.control("shutdown_request", {"restart": False})
    elif end == "exit 3":
        kernel.kc.execute("import os; os._exit(3)")
    else:
        os.killpg(kernel.proc.pid, signal.SIGTERM)
    assert kernel.proc.wait(scaled(20)) == status


def test_an_interrupt_reaches_the_kernel_and_not_its_supervisor(kernel: LeaseKernel) -> None:
    msg_id = kernel.kc.execute("print('spinning', flush=True)\nwhile True: pass")
    wait_s = scaled(30)
    while kernel.kc.get_iopub_msg(timeout=wait_s)["msg_type"] != "stream":
        pass
    assert kernel.control("interrupt_request") == {"status": "ok"}
    while (reply := kernel.kc.get_shell_msg(timeout=wait_s))["parent_header"]["msg_id"] != msg_id:
        pass
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    os.killpg(kernel.proc.pid, signal.SIGINT)  # a SIGINT to the whole group, too
    assert kernel.run("print('alive')") == "alive\n" and kernel.proc.poll() is None
