"""How each policy scores the nodes for a request, which GPUs it takes, and why none fits.

The per-node scores of a (policy, request, mix) are cached on the state (``_Fit``) and
refreshed only on the rows touched since (``fit``); ``score_rows`` scores any rows, for the
batch pass (``batch``) as for the cache. No I/O, no clock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.core.units import format_size_gb

from .fragmentation import frag_score, unique_rows
from .mix import MILLI, ShapeMix
from .state import ClusterState, PackReply, PackRequest, _Fit

_INF = np.inf
#: scores within this of the best tie (then the seeded order or a seeded draw decides)
TIE = 1e-6
#: per-node cells the cached fits may hold in all (~37 bytes each, ~150 MB): a live cluster
#: sees endless request shapes; 3,400 fits on openb's 1,213 nodes, 400 on 10,000 nodes
FIT_CELLS = 1 << 22


def validate(r: PackRequest) -> None:
    """Refuse a request no node could read (negative counts, shares outside (0, 1])."""
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


def new_fit(state: ClusterState, r: PackRequest) -> _Fit:
    """An unscored per-node cache for a request: what it takes per GPU and where it may go."""
    n = state.n_nodes
    s = state._share_milli(r) if r.gpus else np.zeros(n, dtype=np.int32)
    ok = s <= MILLI
    if r.gpus and r.models:
        ok &= _model_mask(state, tuple(r.models))
    return _Fit(np.full(n, _INF), np.full(n, -1, dtype=np.int64), s, ok)


def fit(state: ClusterState, r: PackRequest, policy: str, mix: ShapeMix | None) -> _Fit:
    """Per-node score of a request under a policy, refreshed on the rows touched since last."""
    key = (policy, r, mix)
    f = state._fits.get(key)
    if f is None:
        if len(state._fits) > max(64, FIT_CELLS // state.n_nodes):  # endless shapes: bounded
            state._fits.clear()
        f = state._fits[key] = new_fit(state, r)
    if f.step == state.step:
        return f
    rows = state._dirty(f.step)
    f.score[rows], f.choice[rows], after = score_rows(state, f, r, policy, mix, rows)
    if after is not None:
        if f.after is None:
            f.after = np.full((2, state.n_nodes), np.nan)
        f.after[:, rows] = after
    f.step = state.step
    return f


def score_rows(
    state: ClusterState, f: _Fit, r: PackRequest, policy: str, mix: ShapeMix | None, rows: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(score, chosen GPU for one-GPU requests, after-states) of the rows.

    Score inf where the request cannot go; after-states as ``fragmentation.frag_score``.
    """
    if policy in ("fragmentation", "fgd") and mix is not None:
        st = state.stats(mix, fill=policy == "fragmentation")
        uniq = unique_rows(state, rows)  # many rows (a first look): score each state once
        calc = rows if uniq is None else uniq[0]
        fitted = _fits_now(state, f, r, calc)
        score, choice, after = frag_score(state, st, r, policy, calc, fitted)
        if uniq is not None:
            score, choice = score[uniq[1]], choice[uniq[1]]
            after = None if after is None else after[:, uniq[1]]
        return score, choice, after
    return (*_plain_score(state, f, r, policy, rows), None)


def offer(state: ClusterState, f: _Fit, mix: ShapeMix, reply: PackReply) -> None:
    """Let ``allocate`` take the chosen row's statistics from its scored after-state.

    ``allocate`` checks that it applies this reply, unchanged, to an unchanged state
    (``fragmentation.adopt``).
    """
    st = state._stats.get((mix, True))
    if f.after is not None and st is not None and reply.node is not None:
        i = reply.node
        state._offer = (state.step, reply, st, float(f.after[0, i]), float(f.after[1, i]))


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


def tie_hash(seed: int, step: int, idx: np.ndarray) -> np.ndarray:
    """Stateless seeded pseudo-random key per node (splitmix64), fresh at every state step."""
    base = (seed * 0x9E3779B97F4A7C15 + step * 0xD1B54A32D192ED03 + 1) % (1 << 64)
    x = idx.astype(np.uint64) + np.uint64(base)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def pick_gpus(state: ClusterState, i: int, r: PackRequest, s: int, choice: int) -> tuple[int, ...]:
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


def hosts(state: ClusterState, r: PackRequest) -> tuple[np.ndarray, str, str | None]:
    """(nodes that could host the request when empty, what it asks, why none ever could)."""
    if r not in state._hosts:  # what could ever host it depends on the node shapes alone
        if len(state._hosts) > 4096:  # endless shapes on a live cluster: keep it bounded
            state._hosts.clear()
        state._hosts[r] = _hosts_ever(state, r)
    return state._hosts[r]


def explain(state: ClusterState, r: PackRequest) -> tuple[str, bool]:
    """Why nothing fits: a reason naming what would, and whether an empty cluster could."""
    cand, what, never = hosts(state, r)
    if never is not None:
        return never, False
    up = cand & state.node_up
    if not up.any():
        return all_down(state, cand), True
    if state._room[0] != state.step:  # failures often come in runs on an unchanged state
        state._room = (state.step, (state.gm == MILLI).sum(1) * 1e6 + state.gm.sum(1))
    j = int(np.argmax(np.where(up, state._room[1], -1.0)))
    return no_room(state, r, what, int(up.sum()), j), True


def all_down(state: ClusterState, cand: np.ndarray) -> str:
    """The reason when every node that could host a request is down."""
    down = [state.node_names[j] for j in np.flatnonzero(cand)[:5]]
    return f"every node that could host it is down ({', '.join(down)})"


def no_room(state: ClusterState, r: PackRequest, what: str, n_up: int, j: int) -> str:
    """The reason when nodes could host a request but none has room now; ``j`` has the most.

    Plain words naming the binding resource on ``j``: the GPUs (how many are free there), or
    its CPUs or memory when the GPUs are there.
    """
    name = state.node_names[j]
    hold = f"{n_up} node{'' if n_up == 1 else 's'} could hold it once jobs end"
    if r.gpus:
        need = int(state._share_milli(r)[j])
        fitting = int(((state.gm[j] >= need) & state.valid[j]).sum())
        if fitting < r.gpus:
            each = " free"
            if r.gpu_mem_gb is not None:
                each = f" with {format_size_gb(r.gpu_mem_gb)} free each"
            elif need < MILLI:
                each = f" with {r.gpu_share:g} of each free"
            return f"needs {what}{each} on one node; the most now is {fitting} on {name} ({hold})"
    for label, need_x, free_x, unit in (
        ("CPUs", r.cpus, state.cpus_free[j], ""),
        ("memory", r.mem_gb, state.mem_free_gb[j], "G"),
    ):
        if free_x + 1e-9 < need_x:
            return (
                f"needs {need_x:g}{unit} {label} beside its GPUs; {name}, which has the GPUs, "
                f"has {max(free_x, 0.0):g}{unit} {label} free ({hold})"
            )
    return f"no room now for {what} on a node it may use; most room on {name} ({hold})"


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
