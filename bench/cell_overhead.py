"""What a ``%%gpu`` cell costs on a warm lease, against the same cell run locally.

Starts ``jupyter server`` (only jupyter-gpusched, default tick/poll intervals, the embedded
simulated cluster), a local python3 kernel that sees the server as its kernels would
(``GPUSCHED_URL``/``GPUSCHED_TOKEN``), warms a lease with one ``%%gpu`` cell, then times the
round trip (execute_request -> idle, as a frontend sees it) of

- ``x = 1`` in the local kernel, and
- ``%%gpu`` + ``x = 1`` (relayed through the local kernel to the lease's remote kernel over the
  server's SSH port forwards), and
- ``x = 1`` sent straight to the remote kernel's forwarded ports (no local kernel, no magic),
  which splits the added cost into forwarding and relaying.

Prints median and p95 of each and the added cost. Target: under 20 ms added at the median.

Run: ``.venv/bin/python bench/cell_overhead.py [--cells 200]``
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _server import TOKEN, start_server
from jupyter_client.manager import start_new_kernel


def run(kc: object, code: str) -> float:
    """Seconds from sending ``code`` to the kernel going idle; fails on a cell error."""
    t0 = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"cell failed: {reply['content']}")
    return elapsed


def connect_direct(url: str) -> object:
    """A client of the warm lease's remote kernel, as the magic gets it from the API."""
    from jupyter_client import BlockingKernelClient

    from jupyter_gpusched.client.api import GpuSchedClient

    client = GpuSchedClient(url, TOKEN)
    (lease,) = client.leases()
    answer = client.lease_kernel(lease.id)
    kc = BlockingKernelClient()
    kc.load_connection_info(answer.connection.model_dump())
    kc.start_channels()
    kc.wait_for_ready(timeout=30)
    return kc


def summary(samples: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in samples)
    return statistics.median(ms), ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=200, help="timed cells of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpusched-bench-") as tmp:
        root = Path(tmp)
        proc, url, env = start_server(root)
        km = kc = None
        try:
            kernel_env = {**env, "GPUSCHED_URL": url, "GPUSCHED_TOKEN": TOKEN}
            km, kc = start_new_kernel(kernel_name="python3", env=kernel_env, cwd=str(root))
            run(kc, "%load_ext jupyter_gpusched")
            t0 = time.perf_counter()
            run(kc, "%%gpu --gpus 1\nx = 0")
            first_s = time.perf_counter() - t0
            for _ in range(10):  # warm both paths
                run(kc, "x = 1")
                run(kc, "%%gpu\nx = 1")
            direct_kc = connect_direct(url)
            for _ in range(10):
                run(direct_kc, "x = 1")
            local, remote, direct = [], [], []
            for _ in range(args.cells):  # interleaved, so load on the machine hits all alike
                local.append(run(kc, "x = 1"))
                remote.append(run(kc, "%%gpu\nx = 1"))
                direct.append(run(direct_kc, "x = 1"))
            direct_kc.stop_channels()
            run(kc, "%gpu release")
        finally:
            if kc is not None:
                kc.stop_channels()
            if km is not None:
                km.shutdown_kernel(now=True)
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    (lm, lp), (rm, rp), (dm, dp) = summary(local), summary(remote), summary(direct)
    print(f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(f"cells timed: {args.cells} of each (interleaved), after 10 warm-up cells each")
    print(f"first %%gpu cell (lease granted + remote kernel start): {first_s * 1000:.0f} ms")
    print(f"local kernel   x = 1 : median {lm:6.2f} ms   p95 {lp:6.2f} ms")
    print(f"%%gpu warm     x = 1 : median {rm:6.2f} ms   p95 {rp:6.2f} ms")
    print(f"remote kernel direct : median {dm:6.2f} ms   p95 {dp:6.2f} ms   (forwarded ports)")
    print(
        f"added by %%gpu       : median {rm - lm:6.2f} ms   p95 {rp - lp:6.2f} ms"
        f"   (target: < 20 ms at the median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
