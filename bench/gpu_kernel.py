"""What a cell costs on a GPU kernel ("Python 3 (1 GPU)") against a local kernel, in one run.

Starts the simulated cluster as its own process (as real nodes are: the node side of SSH is
not in the server), a ``jupyter server`` with only jupyter-gpusched reaching it over SSH
(default tick/poll intervals), and drives both kernels through the server's kernel websocket
as JupyterLab does:

- **first cell**: ``POST api/kernels`` (for the GPU kernel: the lease is granted, the remote
  kernel starts, its ports are forwarded) + websocket + ``x = 1`` until idle, on a warm node
  (one GPU kernel started and shut down before), alternating local and GPU kernels;
- **per cell**: ``x = 1`` execute_request -> idle over the websocket, local and GPU kernels
  interleaved, median and p95; plus the same cell sent straight to the GPU kernel's forwarded
  ports (no websocket, no server), which splits the added time into forwarding and bridging;
- **server CPU per cell**: the server process's CPU time (``/proc/PID/stat``) over a block of
  cells on each kernel, divided by the cells. The server holds the SSH connections, so the
  forwarded bytes are encrypted on its event loop.

Run: ``.venv/bin/python bench/gpu_kernel.py [--cells 300] [--starts 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from _server import TOKEN, start_server
from tornado import httpclient, websocket

GPU, LOCAL = "gpusched-1gpu", "python3"


def rest(url: str, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        data = resp.read()
        return json.loads(data) if data else None


class Channels:
    """A kernel's websocket, as a JupyterLab page holds it."""

    def __init__(self, url: str, kernel_id: str) -> None:
        self.url = f"{url.replace('http', 'ws')}api/kernels/{kernel_id}/channels"
        self.session = uuid.uuid4().hex
        self.conn: Any = None

    async def open(self) -> Channels:
        req = httpclient.HTTPRequest(self.url, headers={"Authorization": f"token {TOKEN}"})
        self.conn = await websocket.websocket_connect(req)
        self.conn.protocol.stream.set_nodelay(True)
        return self

    async def read(self) -> dict[str, Any]:
        """The next message; ACKed at once.

        jupyter_server does not set TCP_NODELAY on kernel websockets, so each cell's later
        frames wait for the ACK of its first, which Linux delays up to 40 ms: the same for
        every kernel, and it would drown what this measures.
        """
        message = await asyncio.wait_for(self.conn.read_message(), 120)
        sock = self.conn.protocol.stream.socket
        if sock is not None and hasattr(socket, "TCP_QUICKACK"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return dict(json.loads(message))

    async def run(self, code: str) -> float:
        """Seconds from sending ``code`` to the kernel's idle status for it."""
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session,
                  "username": "bench", "version": "5.3", "date": "2026-11-23T09:00Z"}  # fmt: skip
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content,
               "channel": "shell", "buffers": []}  # fmt: skip
        t0 = time.perf_counter()
        await self.conn.write_message(json.dumps(msg))
        while True:
            reply = await self.read()
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            if reply["msg_type"] == "error":
                raise SystemExit(f"cell failed: {reply['content']}")
            if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()


async def first_cell(url: str, name: str) -> tuple[float, float]:
    """(seconds until the kernel started, seconds until its first cell was done)."""
    t0 = time.perf_counter()
    kernel = await asyncio.to_thread(rest, url, "POST", "api/kernels", {"name": name})
    started = time.perf_counter() - t0
    channels = await Channels(url, kernel["id"]).open()
    await channels.run("x = 1")
    done = time.perf_counter() - t0
    channels.close()
    await asyncio.to_thread(rest, url, "DELETE", f"api/kernels/{kernel['id']}")
    return started, done


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forwarders_cpu_s(server_pid: int) -> float:
    """CPU seconds of the server's kernel-port forwarder processes (see cluster/portforward)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == server_pid and b"jupyter_gpusched.cluster.portforward" in cmdline:
            total += cpu_s(int(entry))
    return total


def summary(samples: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in samples)
    return statistics.median(ms), ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]


async def direct_client(url: str) -> Any:
    """A client of the GPU kernel's forwarded ports (no websocket), as the provisioner gets them."""
    from jupyter_client.asynchronous import AsyncKernelClient

    (lease,) = rest(url, "GET", "gpusched/api/leases")["leases"]
    answer = rest(url, "GET", f"gpusched/api/leases/{lease['id']}/kernel")
    kc = AsyncKernelClient()
    kc.load_connection_info(answer["connection"])
    kc.start_channels()
    await kc.wait_for_ready(timeout=30)
    return kc


async def direct_run(kc: Any, code: str) -> float:
    t0 = time.perf_counter()
    reply = await kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"cell failed: {reply['content']}")
    return time.perf_counter() - t0


async def measure(url: str, server_pid: int, sim_pid: int, cells: int, starts: int) -> None:
    await first_cell(url, GPU)  # warm the node: SSH connection, caches, the agent's imports
    firsts: dict[str, list[tuple[float, float]]] = {LOCAL: [], GPU: []}
    for _ in range(starts):
        for name in (LOCAL, GPU):
            firsts[name].append(await first_cell(url, name))

    kernels = {n: await asyncio.to_thread(rest, url, "POST", "api/kernels", {"name": n})
               for n in (LOCAL, GPU)}  # fmt: skip
    chans = {n: await Channels(url, k["id"]).open() for n, k in kernels.items()}
    direct = await direct_client(url)
    for _ in range(20):
        for n in (LOCAL, GPU):
            await chans[n].run("x = 1")
        await direct_run(direct, "x = 1")
    times: dict[str, list[float]] = {LOCAL: [], GPU: [], "direct": []}
    for _ in range(cells):  # interleaved: load on the machine hits all alike
        for n in (LOCAL, GPU):
            times[n].append(await chans[n].run("x = 1"))
        times["direct"].append(await direct_run(direct, "x = 1"))
    cpu: dict[str, tuple[float, float, float]] = {}
    for n in (LOCAL, GPU):  # blocks, so each kernel's server CPU is counted apart
        server0, fwd0, sim0 = cpu_s(server_pid), forwarders_cpu_s(server_pid), cpu_s(sim_pid)
        for _ in range(cells):
            await chans[n].run("x = 1")
        cpu[n] = (
            (cpu_s(server_pid) - server0) / cells * 1000,
            (forwarders_cpu_s(server_pid) - fwd0) / cells * 1000,
            (cpu_s(sim_pid) - sim0) / cells * 1000,
        )
    direct.stop_channels()
    for n, k in kernels.items():
        chans[n].close()
        await asyncio.to_thread(rest, url, "DELETE", f"api/kernels/{k['id']}")

    print(f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for n in (LOCAL, GPU):
        started = statistics.median(s for s, _ in firsts[n]) * 1000
        done = statistics.median(d for _, d in firsts[n]) * 1000
        print(f"first cell, {n:14}: kernel started {started:6.0f} ms, first cell done "
              f"{done:6.0f} ms (median of {starts}, warm node)")  # fmt: skip
    (lm, lp), (gm, gp), (dm, dp) = (summary(times[k]) for k in (LOCAL, GPU, "direct"))
    print(f"cells timed: {cells} of each (interleaved), after 20 warm-up cells each")
    print(f"local kernel  x = 1 (websocket)   : median {lm:6.2f} ms   p95 {lp:6.2f} ms")
    print(f"GPU kernel    x = 1 (websocket)   : median {gm:6.2f} ms   p95 {gp:6.2f} ms")
    print(f"GPU kernel    x = 1 (direct ZMQ)  : median {dm:6.2f} ms   p95 {dp:6.2f} ms")
    print(f"added by the GPU kernel           : median {gm - lm:6.2f} ms   p95 {gp - lp:6.2f} ms"
          "   (goal: <= 2 ms)")  # fmt: skip
    for n in (LOCAL, GPU):
        server, forwarder, sim = cpu[n]
        print(f"server CPU per cell, {n:14}: {server:5.2f} ms   (its port forwarder process: "
              f"{forwarder:5.2f} ms; node side, sim: {sim:5.2f} ms)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=300, help="timed cells of each kind")
    parser.add_argument("--starts", type=int, default=5, help="kernel starts of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        sim = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpusched.cluster.sim.serve", str(root / "sim")],
            stdout=subprocess.DEVNULL,
        )
        proc = None
        try:
            while not (root / "sim" / "nodes.json").exists():
                time.sleep(0.1)
            nodes = json.loads((root / "sim" / "nodes.json").read_text())
            (root / "server").mkdir()
            proc, url, _ = start_server(root / "server", gpusched={"nodes": nodes})
            asyncio.run(measure(url, proc.pid, sim.pid, args.cells, args.starts))
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            # the server shut its kernels down, releasing their leases, before the nodes go
            sim.send_signal(signal.SIGTERM)
            sim.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
