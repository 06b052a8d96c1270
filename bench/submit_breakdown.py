"""Where a REST submit's server time goes: the submit handler doing less and less, side by side.

Starts five ``jupyter server`` processes (only jupyter-gpusched, the default simulated cluster,
a SQLite store each, or with ``--postgres`` a database each on one throw-away PostgreSQL),
whose ``POST jobs`` does (``bench/_submit_variants.py``):

- ``auth``: Jupyter's auth and authorization, then a fixed answer (the cost every handler pays);
- ``parse``: also reads and validates the spec and judges admission;
- ``commit``: also queues the job through the group commit and answers with its view, with
  no scheduling pass woken;
- ``real``: the handler as it is (every commit wakes a pass);

and a fifth whose handler is the real one but whose submits commit in a thread of the server
(``GpuSchedApp.store_writer_process = False``), not in the store writer process: the
writer's effect, measured in the same rounds.

All stay up; rounds load them one after another (order alternating), one client and
``--clients`` clients, so a slow spell of the machine hits all alike. Prints the median rate of
each and the server's CPU time (``/proc``) per request, and apart from it that of its children
(the store writer process that commits submissions).

    .venv/bin/python bench/submit_breakdown.py [--submits 300] [--rounds 5] [--clients 8]
        [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _server import FAR_FUTURE, TOKEN, start_server
from _submit_variants import VARIANTS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _fixtures_postgres import _Cluster, _find_bindir, create_database  # noqa: E402

from jupyter_gpusched.client import transport

#: The real handler again, on a server whose submits commit in a thread, not a writer process.
THREAD = "-in-thread"
LABELS = (*VARIANTS, "real" + THREAD)
SPEC = {"kind": "script", "command": ["true"], "gpus": 1, "not_before": FAR_FUTURE}


def _stat(pid: int | str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of process ``pid``, and of its live children (the store
    writer process) together."""
    tick = os.sysconf("SC_CLK_TCK")
    own = _stat(pid)
    children = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry.name)
            except OSError:
                continue
            if fields[1] == str(pid):
                children += int(fields[11]) + int(fields[12])
    return (int(own[11]) + int(own[12])) / tick, children / tick


def load(url: str, pid: int, n: int, clients: int) -> tuple[float, float, float]:
    """Submits per second, and server and child CPU ms per submit, for ``n`` submits."""
    jobs = url.rstrip("/") + "/gpusched/api/jobs"
    headers = {"Authorization": f"token {TOKEN}", "Content-Type": "application/json"}
    body = json.dumps(SPEC).encode()

    def one(_: int) -> None:
        answer = transport.request("POST", jobs, body=body, headers=headers, timeout=30)
        if answer.status != 201:
            raise SystemExit(f"POST jobs answered {answer.status}: {answer.body[:300]!r}")

    (own0, kids0), t0 = cpu_s(pid), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(n)))
    rate = n / (time.perf_counter() - t0)
    own1, kids1 = cpu_s(pid)
    return rate, (own1 - own0) / n * 1000, (kids1 - kids0) / n * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=300, help="submits per figure")
    parser.add_argument("--rounds", type=int, default=5, help="medians of this many")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="each server on a database of a throw-away PostgreSQL (Debian's), not SQLite",
    )
    args = parser.parse_args()
    print(f"command: {' '.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    servers = []
    pg = None
    if args.postgres:
        bindir = _find_bindir()
        if bindir is None:
            raise SystemExit("--postgres needs Debian's postgresql (make system-deps)")
        pg = _Cluster(bindir)
        pg.start()
    try:
        for label in LABELS:
            variant, thread = label.removesuffix(THREAD), label.endswith(THREAD)
            root = Path(tempfile.mkdtemp(prefix=f"gpusched-bench-{variant}-"))
            store = None if pg is None else create_database(pg.url, label.replace("-", "_"))
            proc, url, _ = start_server(
                root,
                store,
                gpusched={"store_writer_process": not thread},
                extensions={"_submit_variants": True},
                extra_env={"GPUSCHED_BENCH_VARIANT": variant},
            )
            servers.append((label, proc, url))
        for _, proc, url in servers:  # warm each one's first-request paths
            load(url, proc.pid, 100, args.clients)
        figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in range(args.rounds):
            for clients in (1, args.clients):
                for variant, proc, url in servers if r % 2 == 0 else servers[::-1]:
                    got = load(url, proc.pid, args.submits, clients)
                    figures.setdefault((variant, clients), []).append(got)
    finally:
        for _, proc, _ in servers:
            proc.send_signal(signal.SIGINT)
        for _, proc, _ in servers:
            proc.wait(30)
        if pg is not None:
            pg.stop()
    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"\nPOST jobs ({store}), {args.submits} per figure, medians of {args.rounds} rounds:")
    for clients in (1, args.clients):
        for variant in LABELS:
            runs = figures[(variant, clients)]
            rate = statistics.median(x[0] for x in runs)
            cpu = statistics.median(x[1] for x in runs)
            writer = statistics.median(x[2] for x in runs)
            print(
                f"  {clients} client(s), {variant:14s}: {rate:7.1f}/s "
                f"(runs {min(x[0] for x in runs):.0f}-{max(x[0] for x in runs):.0f})   "
                f"server CPU {cpu:.2f} ms a request (+ {writer:.2f} in its store writer)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
