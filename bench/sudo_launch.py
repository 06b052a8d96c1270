"""What the serving agents' sudo re-check costs a launch, on Debian's sshd with real users.

In sudo mode an owner's serving agent fingerprints what sudo's answer rests on before each
launch (``serve --watch-accounts``, ``jupyter_gpusched/node/accounts.py``) and the scheduler
asks ``sudo -n -l`` only when it changed. Measured, interleaved on one node so load hits all
alike:

* ``launch, watching``     - alice's launches through her watching serving agent
* ``launch, not watching`` - bob's, through an agent started without ``--watch-accounts``
* ``sudo -n -l``           - the check itself, as the scheduler's account over SSH (what every
  launch would pay if each asked sudo)
* ``launch after a change`` - alice's launch right after ``/etc/sudoers.d`` changed (the check,
  then the launch)

Needs root (it makes the users alice and bob, and a sudoers drop-in); see
``tests/_fixtures_owners.py``.

Run: ``.venv/bin/python bench/sudo_launch.py [--n 100]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from itertools import count
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_owners import NODE, running_owners_node, skip_reason  # noqa: E402
from _fixtures_ssh import gpu_state  # noqa: E402
from _fixtures_users import ensure_user, make_user_python, shared_tempdir  # noqa: E402

from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend  # noqa: E402
from jupyter_gpusched.cluster.ssh.owners import sudo_check_argv  # noqa: E402
from jupyter_gpusched.core.clock import SystemClock  # noqa: E402
from jupyter_gpusched.core.models import Job, JobSpec, Placement  # noqa: E402

ON = Placement(node=NODE, gpu_indices=[0], gpu_uuids=[gpu_state(2)["gpus"][0]["uuid"]])
_ids = count(1)


class NotWatching(SshBackend):
    """Serving agents as before the re-check: started once by sudo, never asking again."""

    @staticmethod
    def _serve_argv(cfg: NodeConfig, user: str | None) -> list[str]:
        return [*cfg.agent_argv(), "serve"]


def _row(name: str, samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"  {name:<24} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms   n={len(ms)}"


async def _launch(backend: SshBackend, user: str) -> float:
    job = Job(
        id=next(_ids),
        spec=JobSpec(user=user, kind="script", command=["true"]),
        submitted_at=SystemClock().now(),
    )
    started = time.perf_counter()
    await backend.launch(job, ON)
    return time.perf_counter() - started


async def bench(cfg: NodeConfig, n: int) -> None:
    watching = SshBackend([cfg], clock=SystemClock())
    plain = NotWatching([cfg], clock=SystemClock())
    check = sudo_check_argv(cfg, [*cfg.agent_argv(), "serve", "--watch-accounts"], "alice")
    samples: dict[str, list[float]] = {k: [] for k in ("watch", "plain", "sudo", "change")}
    try:
        for _ in range(5):  # warm: connections, agents, the first check
            await _launch(watching, "alice")
            await _launch(plain, "bob")
        for i in range(n):
            pair = [("watch", watching, "alice"), ("plain", plain, "bob")]
            for key, backend, user in pair if i % 2 else reversed(pair):
                samples[key].append(await _launch(backend, user))
            started = time.perf_counter()
            await watching.run(NODE, check, check=True)
            samples["sudo"].append(time.perf_counter() - started)
        for _ in range(max(10, n // 5)):
            os.utime("/etc/sudoers.d")  # what an admin's edit does: the next launch checks
            samples["change"].append(await _launch(watching, "alice"))
    finally:
        await watching.close()
        await plain.close()
    print(_row("launch, watching", samples["watch"]))
    print(_row("launch, not watching", samples["plain"]))
    print(_row("sudo -n -l over SSH", samples["sudo"]))
    print(_row("launch after a change", samples["change"]))


def main(argv: list[str] | None = None) -> int:
    """Set up the node (root), run the bench, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="launches per row")
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    users: dict[str, Any] = {name: ensure_user(name) for name in ("alice", "bob", "carol")}
    folder = shared_tempdir("gpusched-bench-py-")
    try:
        with running_owners_node(make_user_python(folder), users) as node:
            print(f"load average {os.getloadavg()[0]:.1f}; Debian sshd, sudo mode")
            asyncio.run(bench(node.node_config("sudo"), args.n))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
