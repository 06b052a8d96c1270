"""The packer's data: node shapes, requests, replies, and the cluster's dense arrays.

``ClusterState`` keeps a cluster as a few arrays (GPUs padded per node, free share in integer
milli-GPUs so that sums never drift) and the caches that let a placement re-score only the
nodes it changed. Mutate it only through its methods so those caches stay right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError

from .fragmentation import Stats, adopt, stats_for
from .mix import MILLI, ShapeMix, weighted_mix


@dataclass(frozen=True)
class NodeShape:
    """One GPU node as configured: what it has when empty."""

    name: str
    gpu_model: str  # e.g. "A100-80GB"; matched case-insensitively, requests may give a prefix
    gpu_mem_gb: float  # memory of each GPU (0 = unknown: memory-sized requests cannot go here)
    gpus: int
    cpus: float
    mem_gb: float
    nvlink_groups: tuple[int, ...] = ()  # NVLink island id of each GPU; empty = one island


@dataclass(frozen=True)
class PackRequest:
    """What one job needs, all on one node."""

    gpus: int  # GPUs on one node (0 = CPU only)
    gpu_share: float = 1.0  # share of each GPU, 0 < share <= 1 (ignored when gpu_mem_gb is set)
    gpu_mem_gb: float | None = None  # GPU memory per GPU; becomes a share per node's GPU size
    cpus: float = 0
    mem_gb: float = 0
    models: tuple[str, ...] = ()  # allowed GPU models (empty = any); prefixes allowed ("A100")


@dataclass(frozen=True)
class PackReply:
    """Where a request goes, or why it cannot go anywhere now (node is None)."""

    node: int | None  # row in the state's arrays
    node_name: str | None
    gpu_indices: tuple[int, ...]  # GPUs on that node, in order
    share_per_gpu: float  # share of each listed GPU the job holds (as reserved, milli-rounded)
    reason: str | None  # for node None: what blocks it and what would fit
    feasible_ever: bool  # False when even an empty cluster could never host it
    cpus: float = 0.0  # CPUs and host memory to reserve with the GPUs (allocate uses them)
    mem_gb: float = 0.0
    score: float | None = None  # the policy's score of the chosen node (lower is better)


def default_mix(max_gpus: int) -> ShapeMix:
    """A generic mix when nothing is known: half GPUs and 1, 2, 4, 8 whole GPUs, equal GPU mass."""
    shapes = [PackRequest(1, 0.5)] + [PackRequest(k) for k in (1, 2, 4, 8) if k <= max(max_gpus, 1)]
    return ShapeMix(tuple(shapes), tuple(1.0 / max(s.gpus * s.gpu_share, 0.1) for s in shapes))


def _milli(share: float) -> int:
    """A share rounded up to milli-GPUs, so a reservation never undercounts."""
    return int(math.ceil(round(share * MILLI, 6)))


def _model_matches(node_model: str, wanted: Sequence[str]) -> bool:
    node = node_model.upper()
    return any(node == w.upper() or node.startswith(w.upper()) for w in wanted)


@dataclass
class _Fit:
    """Cached per-node answer for one (policy, request, mix): refreshed on touched rows only."""

    score: np.ndarray  # (N,) lower is better; inf where it does not fit
    choice: np.ndarray  # (N,) chosen GPU for one-GPU requests (-1 otherwise)
    s: np.ndarray  # (N,) milli per GPU the request takes on each node
    static_ok: np.ndarray  # (N,) model allowed and share <= 1 on that node
    step: int = -1
    #: (2, N) frag and frag_fill each row would have with the request placed as scored
    #: (``fragmentation`` only): ``allocate`` takes them instead of refreshing the row
    after: np.ndarray | None = None


class ClusterState:
    """Dense arrays of a cluster; mutate only through the methods so caches stay right."""

    def __init__(self, nodes: Sequence[NodeShape]) -> None:
        if not nodes:
            raise InvalidSpecError("nodes", "a cluster needs at least one node")
        n = len(nodes)
        g = max(1, max(s.gpus for s in nodes))
        self.shapes: tuple[NodeShape, ...] = tuple(nodes)
        self.node_names: list[str] = [s.name for s in nodes]
        self.index: dict[str, int] = {s.name: i for i, s in enumerate(nodes)}
        self.models: list[str] = sorted({s.gpu_model for s in nodes})
        self.model_id = np.array([self.models.index(s.gpu_model) for s in nodes], dtype=np.int32)
        self.gpu_count = np.array([s.gpus for s in nodes], dtype=np.int32)
        self.gpu_mem_gb = np.array([s.gpu_mem_gb for s in nodes], dtype=np.float64)
        self.cpus_total = np.array([s.cpus for s in nodes], dtype=np.float64)
        self.mem_total_gb = np.array([s.mem_gb for s in nodes], dtype=np.float64)
        self.valid = np.arange(g)[None, :] < self.gpu_count[:, None]
        self.gm = np.where(self.valid, MILLI, 0).astype(np.int32)  # free milli per GPU
        self.nvlink = np.zeros((n, g), dtype=np.int32)
        for i, s in enumerate(nodes):
            if s.nvlink_groups:
                self.nvlink[i, : len(s.nvlink_groups)] = s.nvlink_groups
        self.cpus_free = self.cpus_total.copy()
        self.mem_free_gb = self.mem_total_gb.copy()
        self.node_up = np.ones(n, dtype=bool)
        self.foreign = np.zeros((n, g), dtype=np.int32)  # milli taken by processes not ours
        self.step = 0  # bumps on every change; with touched, drives cache refresh
        self.touched = np.zeros(n, dtype=np.int64)
        self._log: list[int] = []  # node changed at each step since _log_base: recent changes
        self._log_base = 1
        self._stats: dict[tuple[ShapeMix, bool], Stats] = {}
        self._fits: dict[tuple[Any, ...], _Fit] = {}
        self._orders: dict[int, np.ndarray] = {}
        self._arrivals: dict[PackRequest, float] = {}
        self._arrival_mix: ShapeMix | None = None
        self._arrival_total = 0.0
        self._arrival_built = 0.0
        self._generic_mix: ShapeMix | None = None
        self._model_sets: dict[tuple[str, ...], np.ndarray] = {}
        self._hosts: dict[PackRequest, tuple[np.ndarray, str, str | None]] = {}
        self._room: tuple[int, np.ndarray] = (-1, np.zeros(0))  # (step, most-room key per node)
        # (step, reply, stats, frag, frag_fill): the reply pack gave and its scored after-state
        self._offer: tuple[Any, ...] | None = None

    @classmethod
    def from_nodes(cls, nodes: Sequence[NodeShape]) -> ClusterState:
        """Build the arrays of an empty cluster."""
        return cls(nodes)

    # -- read-only views ------------------------------------------------------------------------
    @property
    def gpu_free(self) -> np.ndarray:
        """(N, G) free share of each GPU, 0..1 (padding GPUs read 0). A copy: do not mutate."""
        return self.gm / MILLI

    @property
    def n_nodes(self) -> int:  # noqa: D102
        return len(self.node_names)

    # -- mutation -------------------------------------------------------------------------------
    def _touch(self, node: int) -> None:
        self.step += 1
        self.touched[node] = self.step
        self._log.append(node)
        if len(self._log) > 256:  # only the last few steps are looked up
            del self._log[:128]
            self._log_base += 128

    def _node(self, node: int | str) -> int:
        if isinstance(node, str):
            if node not in self.index:
                raise InvalidSpecError("node", f"no node named {node!r}")
            return self.index[node]
        return int(node)

    def allocate(
        self, placement: Any, *, cpus: float | None = None, mem_gb: float | None = None
    ) -> None:
        """Reserve what a PackReply (or a models.Placement, plus cpus/mem_gb) holds."""
        if getattr(placement, "node", None) is None:
            raise InvalidSpecError("placement", "cannot allocate a reply with no node")
        i = self._node(placement.node)
        take = _milli(float(placement.share_per_gpu))
        idx = list(placement.gpu_indices)
        row = self.gm[i]
        if idx and (row[idx] < take).any():
            raise InvalidSpecError("placement", f"GPUs {idx} on {self.node_names[i]} lack room")
        c = float(cpus if cpus is not None else getattr(placement, "cpus", 0.0) or 0.0)
        m = float(mem_gb if mem_gb is not None else getattr(placement, "mem_gb", 0.0) or 0.0)
        row[idx] -= take
        self.cpus_free[i] -= c
        self.mem_free_gb[i] -= m
        self._touch(i)
        offer, self._offer = self._offer, None
        if offer is not None and offer[0] == self.step - 1 and offer[1] is placement:
            if c == placement.cpus and m == placement.mem_gb:  # as scored: same CPUs, memory
                adopt(self, offer[2], i, offer[3], offer[4])

    def release(
        self,
        node: int | str,
        gpu_indices: Sequence[int],
        share: float,
        *,
        cpus: float = 0.0,
        mem_gb: float = 0.0,
    ) -> None:
        """Give back ``share`` of each listed GPU (and CPUs, memory) on a node."""
        i = self._node(node)
        idx = list(gpu_indices)
        cap = np.where(self.valid[i, idx], MILLI, 0) - self.foreign[i, idx]
        self.gm[i, idx] = np.minimum(self.gm[i, idx] + _milli(share), cap)
        self.cpus_free[i] = min(self.cpus_free[i] + cpus, self.cpus_total[i])
        self.mem_free_gb[i] = min(self.mem_free_gb[i] + mem_gb, self.mem_total_gb[i])
        self._touch(i)

    def occupy_foreign(self, node: int | str, gpu: int, share: float) -> None:
        """Mark ``share`` of a GPU as used by processes we did not start (0 clears the mark)."""
        i = self._node(node)
        new = min(_milli(share), MILLI)
        self.gm[i, gpu] = max(0, self.gm[i, gpu] + self.foreign[i, gpu] - new)
        self.foreign[i, gpu] = new
        self._touch(i)

    def set_node_up(self, node: int | str, up: bool) -> None:
        """Take a node out of (or back into) placement; its reservations stay as they are."""
        i = self._node(node)
        self.node_up[i] = bool(up)
        self._touch(i)

    def record_arrival(self, request: PackRequest, weight: float = 1.0) -> None:
        """Count a request in the recent-arrival mix that policies use when given no mix."""
        # Newer arrivals count more (weight grows 0.1 % per arrival): the mix follows the
        # recent workload without a decay pass over every shape.
        self._arrival_total += 1
        grow = 1.001**self._arrival_total
        self._arrivals[request] = self._arrivals.get(request, 0.0) + weight * grow

    def arrival_mix(self) -> ShapeMix | None:
        """The mix of recorded arrivals (weighted by GPUs), or None before any.

        Rebuilt only when arrivals grew by 25 % (or 32) since the last build: every new mix
        object invalidates the per-node caches.
        """
        if not self._arrivals:
            return None
        grown = self._arrival_total - self._arrival_built
        if self._arrival_mix is None or grown >= max(32, 0.25 * self._arrival_built):
            self._arrival_mix = weighted_mix(self._arrivals)
            self._arrival_built = self._arrival_total
        return self._arrival_mix

    def _models_of(self, models: tuple[str, ...]) -> np.ndarray:
        """Indices into ``models`` that a model constraint allows (cached)."""
        if models not in self._model_sets:
            self._model_sets[models] = np.array(
                [i for i, name in enumerate(self.models) if _model_matches(name, models)],
                dtype=np.int64,
            )
        return self._model_sets[models]

    def _default_mix(self) -> ShapeMix:
        if self._generic_mix is None:
            self._generic_mix = default_mix(int(self.gpu_count.max()))
        return self._generic_mix

    def copy(self) -> ClusterState:
        """An independent copy (caches are rebuilt on demand)."""
        new = object.__new__(ClusterState)
        new.__dict__.update(self.__dict__)
        for name in ("gm", "cpus_free", "mem_free_gb", "node_up", "foreign", "touched"):
            setattr(new, name, getattr(self, name).copy())
        new._stats, new._fits, new._orders = {}, {}, dict(self._orders)
        new._room = (-1, np.zeros(0))
        new._offer = None
        new._log = list(self._log)
        new._arrivals = dict(self._arrivals)
        return new

    # -- caches ---------------------------------------------------------------------------------
    def _dirty(self, since: int) -> np.ndarray | slice:
        if since < 0:
            return slice(None)
        first = since + 1 - self._log_base
        if first >= 0 and self.step - since < 16:  # a few steps back: no pass over every node
            return np.array(sorted(set(self._log[first:])), dtype=np.int64)
        return np.flatnonzero(self.touched > since)

    def order_rank(self, seed: int) -> np.ndarray:
        """Fixed tie-break rank of each node for a seed (a seeded permutation)."""
        if seed not in self._orders:
            rank = np.empty(self.n_nodes, dtype=np.int64)
            rank[np.random.default_rng(seed).permutation(self.n_nodes)] = np.arange(self.n_nodes)
            self._orders[seed] = rank
        return self._orders[seed]

    def stats(self, mix: ShapeMix, fill: bool = False) -> Stats:
        """Per-node fragmentation for a mix, refreshed on the rows changed since last asked.

        ``frag`` is FGD's measure; with ``fill`` the stats also hold the copies-that-fit
        measure (``frag_fill``) the fragmentation policy blends in.
        """
        return stats_for(self, mix, fill)

    def _share_milli(self, r: PackRequest) -> np.ndarray:
        """(N,) milli each GPU of the request takes on each node; > MILLI where it cannot."""
        if r.gpu_mem_gb is None:
            return np.full(self.n_nodes, _milli(r.gpu_share), dtype=np.int32)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(self.gpu_mem_gb > 0, r.gpu_mem_gb / self.gpu_mem_gb, 2.0)
        return np.minimum(np.ceil(np.round(share * MILLI, 6)), MILLI + 1).astype(np.int32)
