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

from collections.abc import Collection, Iterable
from typing import Any

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError

from .fragmentation import FILL_WEIGHT as FILL_WEIGHT
from .fragmentation import FragMetrics as FragMetrics
from .fragmentation import frag_score, model_pressure, unique_rows
from .fragmentation import metrics as metrics
from .mix import MILLI as MILLI
from .mix import ShapeMix as ShapeMix
from .state import ClusterState as ClusterState
from .state import NodeShape as NodeShape
from .state import PackReply as PackReply
from .state import PackRequest as PackRequest
from .state import _Fit

POLICIES = ("first_fit", "best_fit", "spread", "dot_product", "fragmentation", "fgd")
TIE_BREAKS = ("order", "random")
_INF = np.inf


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
