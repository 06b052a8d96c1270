"""Node health as the scheduler acts on it and shows it: up or down, why, said once.

A node that cannot be reached (a wrong host key, switched off, the network gone) must not take
the API down with it: it is listed down with the reason its backend gave, the server log says
which node and why when that changes, and jobs queue until a node answers. Node and job
states change together: a probe of every node follows as soon as the backend counts a node
down (or back), instead of waiting for the next inventory interval, so a job is never shown
lost on a node still shown up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from jupyter_gpusched.cluster.base import NodeInventory
from jupyter_gpusched.packing import packer

log = logging.getLogger(__name__)

#: Stands in for the cluster while no node has ever answered (the packer needs one node).
NO_NODE = packer.NodeShape(name="", gpu_model="", gpu_mem_gb=0.0, gpus=0, cpus=0.0, mem_gb=0.0)


class NodeWatch:
    """Which nodes the backend counts down, to notice when that changes between probes."""

    def __init__(self, node_down: Callable[[str], bool]) -> None:
        self._node_down = node_down
        self._down: frozenset[str] = frozenset()
        self._said: dict[str, bool] = {}  # what the log last said of each node (up?)

    def probed(self, nodes: Sequence[NodeInventory]) -> None:
        """Remember the backend's view as of a probe of every node."""
        self._down = self._down_now(nodes)

    def changed(self, nodes: Sequence[NodeInventory]) -> bool:
        """Whether a node went down or came back since the last probe."""
        return self._down_now(nodes) != self._down

    def _down_now(self, nodes: Iterable[NodeInventory]) -> frozenset[str]:
        return frozenset(n.name for n in nodes if self._node_down(n.name))

    def say(self, nodes: Sequence[NodeInventory]) -> None:
        """Log each node that went down (with why) or came back, once per change."""
        for node in nodes:
            if self._said.get(node.name, True) == node.up:
                self._said[node.name] = node.up
                continue
            if node.up:
                log.info("gpusched: node %s is up again", node.name)
            else:
                log.warning("gpusched: node %s is down: %s", node.name, node.error or "no answer")
            self._said[node.name] = node.up


def no_node_up(nodes: Sequence[NodeInventory]) -> str | None:
    """Why nothing can be placed when no node is up (None while one is)."""
    if any(n.up for n in nodes):
        return None
    if not nodes:
        return "waiting: no node is configured"
    why = "; ".join(f"{n.name}: {n.error or 'no answer'}" for n in nodes)
    return f"waiting: no node is up ({why})"
