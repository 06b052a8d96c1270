"""Node health as the scheduler acts on it and shows it: up, suspect or down, why, said once.

A node that cannot be reached (a wrong host key, switched off, the network gone) must not take
the API down with it: it is listed with the reason its backend gave, the server log says which
node and why when that changes, and jobs queue until a node answers. Node and job states
change together: a probe of every node follows as soon as the backend counts a node
unreachable (or back), instead of waiting for the next inventory interval.

Unreachable is not down. A network blip of a few seconds must not kill an hour of training, so
a node the backend cannot reach is first *suspect*: it takes no new work, its jobs keep their
GPUs and their state, and only after ``down_after_s`` (Slurm's ``SlurmdTimeout`` is the
precedent, 300 s by default) and a last probe that still finds no answer (the backend's
reconnect backoff may be waiting past the grace) is it *down* and its jobs lost (requeued
while they have retries).
A node that was down is placed on again only once the scheduler reconciled it (re-adopted what
still runs there), so a retry never lands on GPUs its earlier attempt still holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.inventory import NodeInventory
from jupyter_gpusched.packing import packer

log = logging.getLogger(__name__)

#: Stands in for the cluster while no node has ever answered (the packer needs one node).
NO_NODE = packer.NodeShape(name="", gpu_model="", gpu_mem_gb=0.0, gpus=0, cpus=0.0, mem_gb=0.0)


class NodeHealth:
    """Which nodes are suspect (unreachable, within the grace) or down (past it), and since when.

    ``unreachable`` is the backend's word (consecutive failed connects); the time it was first
    seen so is the scheduler's, on its one clock. The grace counts from there: a restart of the
    scheduler starts it again (the nodes' jobs are then kept a little longer, never lost sooner).
    """

    def __init__(
        self, unreachable: Callable[[str], bool], clock: Clock, down_after_s: float
    ) -> None:
        self._unreachable = unreachable
        self._clock = clock
        self.down_after_s = down_after_s
        self._since: dict[str, datetime] = {}
        self._declared: set[str] = set()  # down, and not reconciled since

    def unreachable(self, name: str) -> bool:
        """Whether the backend cannot reach the node now (suspect or down)."""
        if self._unreachable(name):
            self._since.setdefault(name, self._clock.now())
            return True
        self._since.pop(name, None)
        return False

    def since(self, name: str) -> datetime | None:
        """When the node was first seen unreachable, None while it answers."""
        return self._since.get(name) if self.unreachable(name) else None

    def down_at(self, name: str) -> datetime | None:
        """When an unreachable node is (or was) declared down; None while it answers."""
        since = self.since(name)
        return None if since is None else since + timedelta(seconds=self.down_after_s)

    def down(self, name: str) -> bool:
        """Declared down (past the grace and a last probe): its jobs are lost (and requeued)."""
        return name in self._declared and self.unreachable(name)

    def suspect(self, name: str) -> bool:
        """Unreachable, not declared down: no new work, its jobs keep their GPUs."""
        return self.unreachable(name) and name not in self._declared

    def expired(self, names: Iterable[str]) -> list[str]:
        """Suspect nodes whose grace ran out: probe them once more, then :meth:`declare` them."""
        now = self._clock.now()
        return [
            n
            for n in names
            if self.suspect(n) and (at := self.down_at(n)) is not None and now >= at
        ]

    def declare(self, name: str) -> dict[str, Any]:
        """Declare a node down (logged once); the detail of its ``node`` event."""
        self._declared.add(name)
        since = self.since(name)
        log.warning(
            "gpusched: node %s is down: unreachable since %s (%.0f s, node_down_after_s); "
            "its jobs are requeued per their retries",
            name,
            since.isoformat() if since else "?",
            self.down_after_s,
        )
        at = since.isoformat() if since else None
        return {"node": name, "up": False, "down": True, "unreachable_since": at}

    def detail(self, node: NodeInventory) -> dict[str, Any]:
        """A ``node`` event's detail when it stops answering or answers again."""
        detail: dict[str, Any] = {"node": node.name, "up": node.up, "error": node.error}
        since, down_at = self.since(node.name), self.down_at(node.name)
        if since is not None and down_at is not None:
            detail.update(unreachable_since=since.isoformat(), down_at=down_at.isoformat())
        return detail

    def unreachable_view(self, names: Iterable[str]) -> dict[str, tuple[str, datetime, datetime]]:
        """Unreachable nodes for the cluster view: suspect or down, since, declared down at."""
        out = {}
        for name in names:
            since, down_at = self.since(name), self.down_at(name)
            if since is not None and down_at is not None:
                out[name] = (self.state(name), since, down_at)
        return out

    def was_down(self, name: str) -> bool:
        """Declared down and not reconciled since (it is back: what runs there is re-adopted)."""
        return name in self._declared

    def reconciled(self, name: str) -> None:
        """The node answered and its jobs were settled: it may take work again."""
        self._declared.discard(name)

    def placeable(self, name: str) -> bool:
        """Whether the packer may place on the node now."""
        return not self.unreachable(name) and name not in self._declared

    def state(self, name: str) -> str:
        """``up``, ``suspect`` or ``down``, as the API shows it."""
        if not self.unreachable(name):
            return "up"
        return "down" if name in self._declared else "suspect"


class NodeWatch:
    """Which nodes the backend counts down, to notice when that changes between probes."""

    def __init__(self, node_down: Callable[[str], bool]) -> None:
        self._node_down = node_down  # unreachable, in the backend's words
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
                log.warning(
                    "gpusched: node %s does not answer (suspect: no new work; its jobs keep "
                    "their GPUs until it is declared down): %s",
                    node.name,
                    node.error or "no answer",
                )
            self._said[node.name] = node.up


def no_node_up(nodes: Sequence[NodeInventory]) -> str | None:
    """Why nothing can be placed when no node is up (None while one is)."""
    if any(n.up for n in nodes):
        return None
    if not nodes:
        return "waiting: no node is configured"
    why = "; ".join(f"{n.name}: {n.error or 'no answer'}" for n in nodes)
    return f"waiting: no node is up ({why})"
