"""Pure numpy packer: place GPU requests on a cluster while keeping it usable for what comes next.

The cluster is a few dense arrays (GPUs padded per node, free share in integer milli-GPUs so that
sums never drift); a request is a shape (GPUs, share of each, CPUs, memory, model constraint).
``pack`` scores every node that fits and returns a reply, never raising for "does not fit".

Policies (lower score wins; ties by a fixed seeded node order or a seeded random pick):

- ``first_fit``: any node that fits (so the tie-break decides).
- ``best_fit``: least CPU + GPU left over, as FGD's BestFit baseline.
- ``spread``: most left over.
- ``dot_product``: Tetris alignment of the request with the node's free resources.
- ``fgd``: FGD (ATC'23) as its simulator scores it: the growth of the node's fragmentation for
  the shape mix, rounded to ``int(100 * sigmoid(-growth))`` like the reference.
- ``fragmentation`` (default): ours. Blends FGD's measure ("can one more task of each shape
  still run here?") with a copies-that-fit measure (how much of the idle GPU copies of each
  shape could use, limited by GPU slots, CPUs and memory), so GPUs stranded by exhausted CPUs
  count; scores unrounded, so ties are rare and the result does not hang on the tie-break;
  and charges work that could run anywhere for taking GPUs of models that model-constrained
  work depends on (``ShapeMix.model_demand``), in proportion to how scarce they are. First of
  all it packs GPU shares well: each share pays what it loses for good of the GPU it lands on
  (``fragmentation.slot_loss``), with GPU sizes priced by the fluid bin-packing LP of the mix,
  so a 0.32 share opens a fresh GPU (room for a 0.65 later) rather than leave 0.21 beside a
  0.47 that only rare small shares could use.

Speed comes from caches kept on the state: a placement changes one node, so each node remembers
the step it last changed and every cached per-node score refreshes only the rows touched since.
The shape-mix scoring, its statistics and ``metrics`` live in ``fragmentation``.
No I/O, no clock; randomness only from the caller's seed.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError

from .fragmentation import FILL_WEIGHT as FILL_WEIGHT
from .fragmentation import (
    MILLI,
    ShapeMix,
    Stats,
    frag_score,
    model_pressure,
    stats_for,
    unique_rows,
    weighted_mix,
)
from .fragmentation import FragMetrics as FragMetrics
from .fragmentation import metrics as metrics

POLICIES = ("first_fit", "best_fit", "spread", "dot_product", "fragmentation", "fgd")
TIE_BREAKS = ("order", "random")
_INF = np.inf


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
        if any(self.gm[i, j] < take for j in idx):
            raise InvalidSpecError("placement", f"GPUs {idx} on {self.node_names[i]} lack room")
        c = float(cpus if cpus is not None else getattr(placement, "cpus", 0.0) or 0.0)
        m = float(mem_gb if mem_gb is not None else getattr(placement, "mem_gb", 0.0) or 0.0)
        self.gm[i, idx] -= take
        self.cpus_free[i] -= c
        self.mem_free_gb[i] -= m
        self._touch(i)

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


def _validate(r: PackRequest) -> None:
    if r.gpus < 0:
        raise InvalidSpecError("gpus", f"must be >= 0, not {r.gpus}")
    if r.gpu_mem_gb is None and r.gpus and not 0 < r.gpu_share <= 1:
        raise InvalidSpecError("gpu_share", f"must be in (0, 1], not {r.gpu_share}")
    if r.gpu_mem_gb is not None and r.gpu_mem_gb <= 0:
        raise InvalidSpecError("gpu_mem_gb", f"must be > 0, not {r.gpu_mem_gb}")
    if r.cpus < 0 or r.mem_gb < 0:
        raise InvalidSpecError("cpus", "cpus and mem_gb must be >= 0")


# -- scoring ------------------------------------------------------------------------------------
def _model_mask(state: ClusterState, models: tuple[str, ...]) -> np.ndarray:
    return np.isin(state.model_id, state._models_of(models))


def _fit(state: ClusterState, r: PackRequest, policy: str, mix: ShapeMix | None) -> _Fit:
    """Per-node score of a request under a policy, refreshed on the rows touched since last."""
    key = (policy, r, mix)
    f = state._fits.get(key)
    if f is None:
        if len(state._fits) > 4096:  # a live cluster sees endless shapes: keep the cache bounded
            state._fits.clear()
        n = state.n_nodes
        s = state._share_milli(r) if r.gpus else np.zeros(n, dtype=np.int32)
        ok = s <= MILLI
        if r.gpus and r.models:
            ok &= _model_mask(state, tuple(r.models))
        f = _Fit(np.full(n, _INF), np.full(n, -1, dtype=np.int64), s, ok)
        state._fits[key] = f
    if f.step == state.step:
        return f
    rows = state._dirty(f.step)
    if policy in ("fragmentation", "fgd") and mix is not None:
        st = state.stats(mix, fill=policy == "fragmentation")
        uniq = unique_rows(state, rows)  # many rows (a first look): score each state once
        calc = rows if uniq is None else uniq[0]
        score, choice = frag_score(state, st, r, policy, calc, _fits_now(state, f, r, calc))
        if uniq is not None:
            score, choice = score[uniq[1]], choice[uniq[1]]
    else:
        score, choice = _plain_score(state, f, r, policy, rows)
    f.score[rows] = score
    f.choice[rows] = choice
    f.step = state.step
    return f


def _fits_now(
    state: ClusterState, f: _Fit, r: PackRequest, rows: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(free milli, milli per GPU, GPUs with room, node fits) of the rows for the request."""
    gm = state.gm[rows]
    s = f.s[rows]
    fits = gm >= s[:, None]
    ok = (
        f.static_ok[rows]
        & state.node_up[rows]
        & (state.cpus_free[rows] >= r.cpus - 1e-9)
        & (state.mem_free_gb[rows] >= r.mem_gb - 1e-9)
    )
    if r.gpus:
        ok &= fits.sum(1) >= r.gpus
    return gm, s, fits, ok


def _plain_score(
    state: ClusterState, f: _Fit, r: PackRequest, policy: str, rows: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(score, chosen GPU) of the rows under the policies that ignore the shape mix."""
    gm, s, fits, ok = _fits_now(state, f, r, rows)
    choice = np.full(len(gm), -1, dtype=np.int64)
    used = r.gpus * s
    cpu_left = (state.cpus_free[rows] - r.cpus) / max(state.cpus_total.max(), 1e-9)
    gpu_left = (gm.sum(1) - used) / max(state.gpu_count.max() * MILLI, 1)
    if policy == "best_fit":
        score = 0.5 * cpu_left + 0.5 * gpu_left
    elif policy == "spread":
        score = -(0.5 * cpu_left + 0.5 * gpu_left)
    elif policy == "dot_product":  # Tetris: align the demand with what the node has free
        ct = np.maximum(state.cpus_total[rows], 1e-9)
        mt = np.maximum(state.mem_total_gb[rows], 1e-9)
        gt = np.maximum(state.gpu_count[rows] * MILLI, 1)
        score = -(
            (state.cpus_free[rows] / ct) * (r.cpus / ct)
            + (state.mem_free_gb[rows] / mt) * (r.mem_gb / mt)
            + (gm.sum(1) / gt) * (used / gt)
        )
    else:
        score = np.zeros(len(gm))
    if r.gpus == 1:
        if policy == "spread":
            choice = np.where(fits, gm, -1).argmax(1)
        elif policy == "first_fit":
            choice = fits.argmax(1)
        else:
            choice = np.where(fits, gm, 2 * MILLI).argmin(1)
    return np.where(ok, score, _INF), choice


def _tie_hash(seed: int, step: int, idx: np.ndarray) -> np.ndarray:
    """Stateless seeded pseudo-random key per node (splitmix64), fresh at every state step."""
    base = (seed * 0x9E3779B97F4A7C15 + step * 0xD1B54A32D192ED03 + 1) % (1 << 64)
    x = idx.astype(np.uint64) + np.uint64(base)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _pick_gpus(state: ClusterState, i: int, r: PackRequest, s: int, choice: int) -> tuple[int, ...]:
    """GPUs on the chosen node: the scored GPU for one, else one NVLink island when possible."""
    if r.gpus == 0:
        return ()
    if r.gpus == 1 and choice >= 0:
        return (int(choice),)
    gm = state.gm[i]
    free = np.flatnonzero(gm >= s)
    if s < MILLI:  # shared GPUs: the tightest ones, keeping roomy GPUs roomy
        return tuple(sorted(int(j) for j in free[np.argsort(gm[free], kind="stable")][: r.gpus]))
    islands = state.nvlink[i, free]
    ids, counts = np.unique(islands, return_counts=True)
    enough = counts >= r.gpus
    if enough.any():  # the smallest island that holds the whole job keeps big islands whole
        best = ids[enough][np.argmin(counts[enough])]
        return tuple(int(j) for j in free[islands == best][: r.gpus])
    order = np.argsort(-counts[np.searchsorted(ids, islands)], kind="stable")
    return tuple(sorted(int(j) for j in free[order][: r.gpus]))


def _explain(state: ClusterState, r: PackRequest) -> tuple[str, bool]:
    """Why nothing fits: a reason naming what would, and whether an empty cluster could."""
    if r not in state._hosts:  # what could ever host it depends on the node shapes alone
        if len(state._hosts) > 4096:  # endless shapes on a live cluster: keep it bounded
            state._hosts.clear()
        state._hosts[r] = _hosts_ever(state, r)
    cand, what, never = state._hosts[r]
    if never is not None:
        return never, False
    up = cand & state.node_up
    if not up.any():
        down = [state.node_names[j] for j in np.flatnonzero(cand)[:5]]
        return f"every node that could host it is down ({', '.join(down)})", True
    if state._room[0] != state.step:  # failures often come in runs on an unchanged state
        state._room = (state.step, (state.gm == MILLI).sum(1) * 1e6 + state.gm.sum(1))
    room = state._room[1]
    j = int(np.argmax(np.where(up, room, -1.0)))
    return (
        f"no room now for {what}, {r.cpus:g} CPUs, {r.mem_gb:g} GB: {int(up.sum())} node(s)"
        f" could host it when free; most room now on {state.node_names[j]}: "
        f"{int(room[j] // 1e6)} whole GPU(s), {state.gm[j].sum() / MILLI:g} GPU in all, "
        f"{state.cpus_free[j]:g} CPUs, {state.mem_free_gb[j]:g} GB",
        True,
    )


def _hosts_ever(state: ClusterState, r: PackRequest) -> tuple[np.ndarray, str, str | None]:
    """(nodes that could host the request when empty, what it asks, why none ever could)."""
    cand = np.ones(state.n_nodes, dtype=bool)
    what = f"{r.gpus} GPU{'' if r.gpus == 1 else 's'}"
    if r.gpus and r.models:
        cand = _model_mask(state, tuple(r.models))
        if not cand.any():
            return (
                cand,
                what,
                (f"no GPU of model {'|'.join(r.models)}; models here: {', '.join(state.models)}"),
            )
        what += f" of model {'|'.join(r.models)}"
    if r.gpus:
        s = state._share_milli(r)
        if r.gpu_mem_gb is not None and not (s[cand] <= MILLI).any():
            j = int(np.flatnonzero(cand)[np.argmax(state.gpu_mem_gb[cand])])
            return (
                cand,
                what,
                (
                    f"no GPU has {r.gpu_mem_gb:g} GB of memory; the largest has "
                    f"{state.gpu_mem_gb[j]:g} GB ({state.node_names[j]})"
                ),
            )
        cand &= s <= MILLI
        best = int(np.flatnonzero(cand)[np.argmax(state.gpu_count[cand])])
        if state.gpu_count[best] < r.gpus:
            return (
                cand,
                what,
                (
                    f"no node has {what}; the largest has {state.gpu_count[best]} "
                    f"({state.node_names[best]})"
                ),
            )
        cand &= state.gpu_count >= r.gpus
    for name, need, total, unit in (
        ("CPUs", r.cpus, state.cpus_total, ""),
        ("memory", r.mem_gb, state.mem_total_gb, " GB"),
    ):
        if not (total[cand] >= need).any():
            j = int(np.flatnonzero(cand)[np.argmax(total[cand])])
            return (
                cand,
                what,
                (
                    f"no node with {what} has {need:g}{unit} {name}; the largest has "
                    f"{total[j]:g}{unit} ({state.node_names[j]})"
                ),
            )
        cand &= total >= need
    return cand, what, None


# -- public entry points ------------------------------------------------------------------------
def pack(
    state: ClusterState,
    request: PackRequest,
    *,
    policy: str = "fragmentation",
    tie_break: str = "order",
    seed: int = 0,
    shape_mix: ShapeMix | None = None,
    only: int | str | None = None,
    exclude: Collection[int | str] = (),
) -> PackReply:
    """Choose a node and GPUs for one request; the state is not changed (see ``allocate``).

    Parameters
    ----------
    state
        The cluster; read only here.
    request
        What the job needs.
    policy
        One of ``POLICIES``. ``fragmentation`` and ``fgd`` keep room for ``shape_mix``
        (default: the state's recorded arrivals, else a generic 1/2/4/8-GPU mix).
    tie_break
        ``order``: equal scores go to the first node of a fixed seeded order (packs work
        together); ``random``: a seeded pseudo-random pick, fresh at every state change.
    seed
        Seeds the node order or the random pick; the only source of randomness.
    shape_mix
        The shapes to keep room for (fragmentation policies only).
    only, exclude
        Choose this node or nothing; never choose these nodes (e.g. one kept for another
        job). The reason given when nothing fits still speaks of the whole cluster.
    """
    _validate(request)
    if policy not in POLICIES:
        raise InvalidSpecError("policy", f"unknown policy {policy!r}; choose from {POLICIES}")
    if tie_break not in TIE_BREAKS:
        raise InvalidSpecError("tie_break", f"must be 'order' or 'random', not {tie_break!r}")
    mix = shape_mix
    if mix is None and policy in ("fragmentation", "fgd"):
        mix = state.arrival_mix() or state._default_mix()
    f = _fit(state, request, policy, mix)
    score = f.score
    if policy == "fragmentation" and mix is not None and mix.model_demand and request.gpus:
        score = score + request.gpus * f.s * model_pressure(state, mix)[state.model_id]
    if only is not None or exclude:
        allowed = np.ones(state.n_nodes, dtype=bool)
        if only is not None:
            allowed[:] = False
            allowed[state._node(only)] = True
        for node in exclude:
            allowed[state._node(node)] = False
        score = np.where(allowed, score, _INF)
    best = score.min()
    if not np.isfinite(best):
        reason, ever = _explain(state, request)
        return PackReply(None, None, (), 0.0, reason, ever, request.cpus, request.mem_gb)
    cand = np.flatnonzero(score <= best + 1e-6)
    i = int(cand[0])
    if len(cand) > 1:
        key = (
            state.order_rank(seed)[cand]
            if tie_break == "order"
            else _tie_hash(seed, state.step, cand)
        )
        i = int(cand[np.argmin(key)])
    s = int(f.s[i])
    gpus = _pick_gpus(state, i, request, s, int(f.choice[i]))
    return PackReply(
        i,
        state.node_names[i],
        gpus,
        s / MILLI if gpus else 0.0,
        None,
        True,
        float(request.cpus),
        float(request.mem_gb),
        float(best),
    )


def pack_many(
    state: ClusterState,
    requests: Iterable[PackRequest],
    *,
    policy: str = "fragmentation",
    tie_break: str = "order",
    seed: int = 0,
    shape_mix: ShapeMix | None = None,
) -> list[PackReply]:
    """Place requests one by one in the given order, applying each placement to ``state``."""
    replies = []
    for r in requests:
        if shape_mix is None:
            state.record_arrival(r)
        reply = pack(state, r, policy=policy, tie_break=tie_break, seed=seed, shape_mix=shape_mix)
        if reply.node is not None:
            state.allocate(reply)
        replies.append(reply)
    return replies
