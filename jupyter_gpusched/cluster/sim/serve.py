"""``python -m jupyter_gpusched.cluster.sim.serve DIR``: the simulated cluster on its own.

The embedded cluster normally lives inside one Jupyter server. Run on its own, several
schedulers can share it as they would share real nodes -- e.g. to try the lab-wide service
and a standby on one machine, or to kill a scheduler without killing its nodes. It writes the
``c.GpuSchedApp.nodes`` configuration that reaches it to ``DIR/nodes.json`` (and prints it),
then serves until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .cluster import SimCluster


def node_entries(sim: SimCluster) -> list[dict[str, Any]]:
    """The ``GpuSchedApp.nodes`` entries that reach ``sim``'s nodes."""
    entries = []
    for cfg in sim.node_configs():
        skip = ("client_keys", "agent_cmd", "run_as", "user_key_file")  # the app sets these
        entry = {k: v for k, v in asdict(cfg).items() if k not in skip and v is not None}
        entry["key_files"] = list(cfg.client_keys)
        entries.append(entry)
    return entries


async def serve(base_dir: Path) -> None:
    """Start the nodes, publish how to reach them, and serve until SIGTERM or SIGINT."""
    sim = SimCluster(base_dir=base_dir)
    await sim.start()
    text = json.dumps(node_entries(sim), indent=1)
    tmp = base_dir / "nodes.json.tmp"
    tmp.write_text(text)
    tmp.replace(base_dir / "nodes.json")
    print(text, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await sim.stop()  # the jobs keep running, as on real nodes


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_gpusched.cluster.sim.serve", description=__doc__.split("\n")[0]
    )
    parser.add_argument("dir", type=Path, help="directory of the nodes (kept across runs)")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
