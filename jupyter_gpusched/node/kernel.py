"""The lease kernel on the node: start an ipykernel, and report its connection info.

Run by the agent's wrapper as ``python -m jupyter_gpusched.node.kernel kernel
--connection-file F`` (so ``CUDA_VISIBLE_DEVICES`` is set and cancel TERMs its process group),
and by the server's kernel bridge as ``... connection --path F`` to wait for the file. Runs on
GPU nodes: standard library only at the top (ipykernel and zmq are imported when used).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from jupyter_gpusched.core.units import format_duration_s

#: The ports of a kernel connection, in the order jupyter_client lists them.
PORT_KEYS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: Environment variable of a lease: the directory the remote kernel should work in, if the
#: node has it (the simulated nodes share this machine's filesystem; real ones usually not).
KERNEL_CWD_ENV = "GPUSCHED_KERNEL_CWD"
#: Environment variable of a lease: the address the kernel binds instead of 127.0.0.1, when
#: the server reaches the node's address rather than forwarding over SSH (Slurm nodes).
KERNEL_IP_ENV = "GPUSCHED_KERNEL_IP"
MODULE = "jupyter_gpusched.node.kernel"
#: The ipykernel class a lease runs (named, not imported: the supervisor stays light).
KERNEL_CLASS = "jupyter_gpusched.node.lease_ipykernel.LeaseKernel"


def serve_kernel(connection_file: str) -> int:
    """Run an ipykernel under the supervisor; its exit status.

    It binds 127.0.0.1, or ``$GPUSCHED_KERNEL_IP`` when set (a node the server reaches
    directly). The connection file is resolved against the start directory (the job's), then
    the kernel moves to ``$GPUSCHED_KERNEL_CWD`` when that directory exists here. The
    supervisor (:mod:`.supervisor`) starts the kernel again, on the same ports, when it asks to
    restart.
    """
    from .supervisor import supervise

    path = os.path.abspath(os.path.expanduser(connection_file))
    os.environ.pop("JPY_PARENT_PID", None)
    cwd = os.environ.pop(KERNEL_CWD_ENV, "")
    ip = os.environ.pop(KERNEL_IP_ENV, "") or "127.0.0.1"
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    os.umask(0o077)  # the connection file holds the session key
    from .stage import private_kernel_dirs

    private_kernel_dirs()  # ~/.ipython, when the kernel makes it: 0700, as all it makes here
    _write_curve_connection(path, ip)
    argv = [
        sys.executable,
        "-m",
        "ipykernel_launcher",
        "-f",
        path,
        f"--ip={ip}",
        "--transport=tcp",
        "--HistoryManager.enabled=False",
        f"--IPKernelApp.kernel_class={KERNEL_CLASS}",
    ]
    sys.stdout.flush()
    return supervise(argv)


def _write_curve_connection(path: str, ip: str = "127.0.0.1") -> None:
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
        "ip": ip,
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
            raise TimeoutError(
                f"no kernel connection file {path} after {format_duration_s(timeout_s)}"
            )
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    """``kernel --connection-file F`` (start) or ``connection --path F`` (print info)."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    kp = sub.add_parser("kernel", help="run a lease's ipykernel")
    kp.add_argument("--connection-file", required=True)
    cp = sub.add_parser("connection", help="print a kernel's connection info when ready")
    cp.add_argument("--path", required=True)
    cp.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.cmd == "kernel":
        from .supervisor import exit_like

        return exit_like(serve_kernel(args.connection_file))
    try:
        print(json.dumps(wait_connection(args.path, args.timeout)))
    except (TimeoutError, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
