"""Fragmentation scoring for the packer: how much a placement hurts the shapes still to come.

For a shape mix (``ShapeMix``) each node keeps per-shape counts of its free GPUs: how many
GPUs have room for the shape's per-GPU share (``cnt``), the idle milli on GPUs too small for
it (``small``) and how many per-GPU copies the GPUs hold (``slots``). From them come FGD's
fragmentation ("could one more task of each shape run here?") and the copies-that-fit measure
("how much of the idle GPU could copies of each shape use?"). A placement changes a few GPUs
of one node, so its effect is the counts' change on those GPUs alone. For GPU shares, the
fragmentation policy first weighs what a share loses for good of the GPU it lands on
(``slot_loss``): GPU sizes priced by the fluid bin-packing LP of the mix (``slot_value``).

CPUs and host memory: the mix's GPU work needs so many CPUs (and GB) per GPU-milli on
average; a node whose free CPUs or memory fall short of what its free GPUs would need strands
the difference (``host_stranded``). CPU-only work then goes where CPUs are left over beyond
what the node's GPUs need, and GPU work that brings many CPUs per GPU goes where CPUs abound.

Speed: every count is a sum over GPUs of a function of the GPU's free milli (0..1000), so the
functions are tabulated once per mix and a count is one gather and one sum. Rows (nodes) in
the same state (model, free milli per GPU, CPUs, memory, up) score the same, so large
refreshes score each distinct state once (``unique_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .mix import MILLI, ShapeMix
from .pricing import slot_loss, slot_value

if TYPE_CHECKING:
    from .state import ClusterState, PackRequest

_INF = np.inf
#: share of the "copies that fit" measure in the fragmentation policy's score; the rest is
#: FGD's "does one still fit" measure. Chosen on the four openb traces and their CPU-heavy
#: variants together (bench/cpu_heavy.py): 0.25 and 0.5 are within ~0.1 point of each other
#: on the four traces, but FGD's measure, which counts a node's every idle GPU as lost once
#: its CPUs fall below one task's, misleads when CPUs run short (at 2.5x CPU-only CPUs:
#: 0.25 -> 14.9 %, 0.35 -> 13.7 %, 0.5 -> 12.2 %, 0.75 -> 12.6 % unallocated)
FILL_WEIGHT = 0.5
#: weight of the packing loss (``slot_loss``) against the fragmentation growth, both in milli:
#: large, so the loss decides and the fragmentation growth breaks its (frequent) ties. Chosen
#: on all four openb traces together: 1 and 3 fall short of the gain, 5, 10, 30 and 100 are
#: within ~0.1 point of each other on every trace
LOSS_WEIGHT = 10.0
#: refreshes of at least this many rows score each distinct node state once
DEDUP_MIN_ROWS = 64


@dataclass
class Stats:
    """Per-node fragmentation of one shape mix (rows refreshed lazily)."""

    mix: ShapeMix
    d: np.ndarray  # (N, M) milli each shape needs per GPU on each node (1001 = cannot)
    k: np.ndarray  # (M,) GPUs per shape
    c: np.ndarray  # (M,) CPUs
    mm: np.ndarray  # (M,) host memory GB
    mok: np.ndarray  # (N, M) model allowed
    w: np.ndarray  # (M,) weights summing to 1
    counts: np.ndarray  # (N, 3M) per shape: cnt, small, slots (views below)
    frag: np.ndarray  # (N,) FGD's weighted fragmentation in milli
    fill: bool  # also keep the copies-that-fit measure below
    wn: np.ndarray  # (N, M) fill weights per node: CPU-only shapes strand no GPU, and shapes
    # that may not run on a node's model are no loss there (weights renormalised per node)
    frag_fill: np.ndarray  # (N,) FILL_WEIGHT x idle milli that copies of the shapes could not
    # use, plus the idle milli the free CPUs and memory cannot serve (``host_stranded``)
    milli_per_cpu: np.ndarray  # (N,) GPU milli the mix's GPU work runs per CPU on each node
    milli_per_gb: np.ndarray  # (N,) ... per GB of host memory (1e12 where it needs none)
    tid: np.ndarray  # (N,) which table each node reads: nodes with one ``d`` row share one
    table: np.ndarray  # (T * 1001, 3M) per free milli v: [v >= d, v if v < d, v // d] per shape
    value: np.ndarray  # (1001,) worth of a GPU with v milli free to the mix (``slot_value``)
    step: int = -1

    def __post_init__(self) -> None:
        m = self.k.shape[0]
        self.m = m
        self.cnt = self.counts[:, :m]  # (N, M) GPUs with room for the shape's per-GPU share
        self.small = self.counts[:, m : 2 * m]  # (N, M) idle milli on GPUs too small for it
        self.slots = self.counts[:, 2 * m :]  # (N, M) per-GPU copies of the shape the GPUs hold
        self.c_safe = np.where(self.c > 0, self.c, 1.0)  # divisors without warnings
        self.mm_safe = np.where(self.mm > 0, self.mm, 1.0)
        self.c_lo = self.c - 1e-9  # free CPUs (memory) at least this fit one copy
        self.mm_lo = self.mm - 1e-9
        self.c_pad = np.where(self.c > 0, 1e-9, 1e9)  # 1e-9: 8 CPUs / 4 is 2 copies, not 1.99
        self.mm_pad = np.where(self.mm > 0, 1e-9, 1e9)
        self.k_safe = np.maximum(self.k, 1)
        self.kd = self.k * self.d  # (N, M) milli one copy of each shape takes on each node


def compile_stats(state: ClusterState, mix: ShapeMix, fill: bool) -> Stats:
    """Empty per-node statistics and lookup tables of a mix on a cluster (rows not computed)."""
    n, m = state.n_nodes, len(mix.shapes)
    d = np.zeros((n, m), dtype=np.int32)
    mok = np.ones((n, m), dtype=bool)
    for j, s in enumerate(mix.shapes):
        if s.gpus:
            d[:, j] = state._share_milli(s)
            if s.models:
                mok[:, j] = np.isin(state.model_id, state._models_of(tuple(s.models)))
    w = np.asarray(mix.weights, dtype=np.float64)
    wn = np.where(mok & np.array([s.gpus > 0 for s in mix.shapes])[None, :], w, 0.0)
    wn = wn / np.maximum(wn.sum(1, keepdims=True), 1e-12)
    c = np.array([s.cpus for s in mix.shapes], dtype=np.float64)
    mm = np.array([s.mem_gb for s in mix.shapes], dtype=np.float64)
    k = np.array([s.gpus for s in mix.shapes], dtype=np.int32)
    runs = wn * (d <= MILLI)  # the GPU shapes that can run on each node, by weight
    gpu_mass = (runs * (k * d)).sum(1)
    rows, tid = np.unique(d, axis=0, return_inverse=True)
    v = np.arange(MILLI + 1)[None, :, None]
    dt = rows[:, None, :]
    table = np.concatenate(
        [v >= dt, np.where(v < dt, v, 0), v // np.maximum(dt, 1)], axis=2
    ).astype(np.int64)
    return Stats(
        mix,
        d,
        k,
        c,
        mm,
        mok,
        w / max(w.sum(), 1e-12),
        np.zeros((n, 3 * m), dtype=np.int64),
        np.zeros(n, dtype=np.float64),
        fill,
        wn,
        np.zeros(n, dtype=np.float64),
        _per_unit(gpu_mass, runs @ c),
        _per_unit(gpu_mass, runs @ mm),
        tid.ravel().astype(np.int64) * (MILLI + 1),
        table.reshape(-1, 3 * m),
        slot_value(mix) if fill else np.zeros(MILLI + 1),
    )


def _per_unit(gpu_mass: np.ndarray, need: np.ndarray) -> np.ndarray:
    """GPU milli served per unit of a host resource (1e12 where the GPU work needs none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(need > 0, gpu_mass / np.where(need > 0, need, 1.0), 1e12)


def stats_for(state: ClusterState, mix: ShapeMix, fill: bool) -> Stats:
    """The state's statistics of a mix, refreshed on the rows changed since last asked."""
    st = state._stats.get((mix, fill))  # ShapeMix hashes by identity
    if st is None:
        if len(state._stats) > 16:  # mixes come and go (arrival mix): drop stale ones
            state._stats.clear()
            state._fits.clear()
        st = compile_stats(state, mix, fill)
        state._stats[(mix, fill)] = st
    if st.step != state.step:
        refresh_stats(state, st)
    return st


def refresh_stats(state: ClusterState, st: Stats) -> None:
    """Recompute the statistics of the rows changed since ``st`` was last refreshed."""
    rows = state._dirty(st.step)
    g = state.gm[rows]
    counts = st.table[st.tid[rows][:, None] + g].sum(1)  # (R, 3M)
    st.counts[rows] = counts
    frag, fill = measures(
        st, rows, g.sum(1), counts, state.cpus_free[rows], state.mem_free_gb[rows]
    )
    up = state.node_up[rows]
    st.frag[rows] = np.where(up, frag, 0.0)
    if fill is not None:
        st.frag_fill[rows] = np.where(up, fill, 0.0)
    st.step = state.step


def adopt(state: ClusterState, st: Stats, i: int, frag: float, fill: float) -> None:
    """Take row ``i``'s statistics from the after-state its placement was scored with.

    ``frag`` and ``fill`` come from ``frag_score`` (the same ``measures`` that
    ``refresh_stats`` uses, so the same values); called by ``allocate`` only when this
    placement is the one change since the statistics were fresh. The counts are one gather.
    """
    if state._stats.get((st.mix, st.fill)) is st and st.step == state.step - 1:
        st.counts[i] = st.table[st.tid[i] + state.gm[i]].sum(0)
        st.frag[i], st.frag_fill[i] = frag, fill
        st.step = state.step


def _copies_by_host(st: Stats, cpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Copies of each shape the free CPUs and memory allow (>= 1e9 where a shape needs none)."""
    # floor(min(a, b)) == min(floor(a), floor(b)): one floor; st.c_pad adds 1e9 for no need
    by_host = np.floor(np.minimum(cpu / st.c_safe + st.c_pad, mem / st.mm_safe + st.mm_pad))
    return np.maximum(by_host, 0.0)


def fill_frag(
    st: Stats,
    idle: np.ndarray,
    slots: np.ndarray,
    host: np.ndarray,
    kd: np.ndarray,
    wn: np.ndarray,
) -> np.ndarray:
    """Idle milli that copies of each shape could not use if they filled the node, weighted.

    FGD asks whether *one* task of a shape still fits; a node with 8 idle GPUs and CPUs for one
    task then looks unfragmented. Counting how many copies fit (GPU slots, CPUs, memory) sees
    the 7 stranded GPUs. Arguments broadcast: idle (..., 1), the rest (..., M): ``slots``
    per-GPU copies the GPUs hold, ``host`` copies the CPUs and memory allow
    (``_copies_by_host``), ``kd`` GPUs x milli per GPU of each shape, ``wn`` node weights.
    """
    # copies >= 0 (host is clamped), so usable <= the idle milli: no clamp of the difference
    usable = np.minimum(slots // st.k_safe, host) * kd
    return ((idle - usable) * wn).sum(-1)


def host_stranded(
    st: Stats, rows: Any, idle: np.ndarray, cpu: np.ndarray, mem: np.ndarray
) -> np.ndarray:
    """Idle milli the free CPUs and memory cannot serve at the mix's needs per GPU.

    The mix's GPU work asks on average ``1 / milli_per_cpu`` CPUs (and GB) per GPU-milli; a
    node with less free than its idle GPUs would need strands the rest, whatever shapes come.
    Unlike FGD's "does one more task fit", this grows smoothly with each CPU taken, and is
    zero while a node's CPUs exceed what its GPUs need: where CPU-only work costs nothing.
    ``idle``, ``cpu`` and ``mem`` are (R,) or (R, C) for rows ``rows``.
    """
    per_cpu, per_gb = st.milli_per_cpu[rows], st.milli_per_gb[rows]
    if idle.ndim == 2:
        per_cpu, per_gb = per_cpu[:, None], per_gb[:, None]
    served = np.minimum(np.maximum(cpu, 0.0) * per_cpu, np.maximum(mem, 0.0) * per_gb)
    return np.maximum(idle - served, 0.0)


def unique_rows(state: ClusterState, rows: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """One row per distinct node state among ``rows`` and each row's pick, or None if few rows.

    A node's score depends only on its model, GPU size, free milli per GPU, free CPUs and
    memory and whether it is up; early in a replay most nodes are still empty, so a request
    seen for the first time scores a handful of states instead of every node.
    """
    idx = np.arange(state.n_nodes) if isinstance(rows, slice) else rows
    if len(idx) < DEDUP_MIN_ROWS:
        return None
    key = np.column_stack(
        (
            state.model_id[idx],
            state.gpu_mem_gb[idx],
            state.node_up[idx],
            state.cpus_free[idx],
            state.mem_free_gb[idx],
            state.gm[idx],
        )
    )
    order = np.lexsort(key.T)  # sorting columns beats np.unique(axis=0)'s row records
    ks = key[order]
    new = np.empty(len(ks), dtype=bool)
    new[0] = True
    new[1:] = (ks[1:] != ks[:-1]).any(1)
    group = np.cumsum(new) - 1
    inverse = np.empty(len(ks), dtype=np.int64)
    inverse[order] = group
    return idx[order[new]], inverse


def candidates(r: PackRequest, gm: np.ndarray, fits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, C, K) free milli of the K GPUs each candidate placement would change, and validity.

    One candidate per fitting GPU for one-GPU requests, else the tightest ``gpus`` GPUs.
    """
    if r.gpus == 1:
        return gm[:, :, None], fits
    one = np.ones((len(gm), 1), dtype=bool)
    if r.gpus > 1:
        # GPUs too full read as MILLI (a table index): such rows do not fit and are masked
        tight = np.sort(np.where(fits, gm, 2 * MILLI), axis=1)[:, None, : r.gpus]
        return np.minimum(tight, MILLI), one
    return np.zeros((len(gm), 1, 0), dtype=np.int32), one


def after(st: Stats, rows: Any, g: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per-shape counts (R, C, 3M) after taking ``s`` from each candidate's GPUs (``Stats``).

    Only the changed GPUs are looked at (two table gathers); the cached counts give the rest.
    """
    t = st.tid[rows][:, None, None]
    g2 = np.maximum(g - s[:, None, None], 0)
    change = (st.table[t + g2] - st.table[t + g]).sum(2)  # (R, C, 3M)
    change += st.counts[rows][:, None, :]
    return change


def measures(
    st: Stats, rows: Any, idle: np.ndarray, counts: np.ndarray, cpu: np.ndarray, mem: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """(FGD's fragmentation, the CPU-aware part or None) of node states given as counts.

    ``counts`` (R, ..., 3M) per-shape counts, ``idle`` (R, ...) idle milli, ``cpu`` and
    ``mem`` (R,) free. The CPU-aware part (kept with ``fill``) is FILL_WEIGHT x the
    copies-that-fit measure plus ``host_stranded``. Weighted sums are ``(x * w).sum(-1)``,
    not a matrix product, so that a row's value does not depend on the rows beside it.
    """
    m = st.m
    cnt, small, slots = counts[..., :m], counts[..., m : 2 * m], counts[..., 2 * m :]
    if cnt.ndim == 2:  # (R, M): one state per row
        c, mm = cpu[:, None], mem[:, None]
        mok, kd, wn = st.mok[rows], st.kd[rows], st.wn[rows]
    else:  # (R, C, M): candidates per row
        c, mm = cpu[:, None, None], mem[:, None, None]
        mok, kd, wn = st.mok[rows][:, None], st.kd[rows][:, None], st.wn[rows][:, None]
    ok = (cnt >= st.k) & (c >= st.c_lo) & (mm >= st.mm_lo) & mok
    frag = (np.where(ok, small, idle[..., None]) * st.w).sum(-1)
    if not st.fill:
        return frag, None
    fill = FILL_WEIGHT * fill_frag(st, idle[..., None], slots, _copies_by_host(st, c, mm), kd, wn)
    fill += host_stranded(st, rows, idle, c[..., 0], mm[..., 0])
    return frag, fill


def delta(
    st: Stats,
    rows: Any,
    idle2: np.ndarray,
    counts: np.ndarray,
    cpu2: np.ndarray,
    mem2: np.ndarray,
) -> np.ndarray:
    """Growth of the node's fragmentation for after-states given as (R, ..., 3M) counts.

    FGD's measure, blended with the CPU-aware part when the stats keep it (``measures``).
    ``idle2`` (R, ...) is the idle milli after; ``cpu2``, ``mem2`` (R,) what is left free.
    """
    frag, fill = measures(st, rows, idle2, counts, cpu2, mem2)
    return _growth(st, rows, frag, fill)


def _growth(st: Stats, rows: Any, frag: np.ndarray, fill: np.ndarray | None) -> np.ndarray:
    before = st.frag[rows] if frag.ndim == 1 else st.frag[rows][:, None]
    out = frag - before
    if fill is None:
        return out
    before_fill = st.frag_fill[rows] if frag.ndim == 1 else st.frag_fill[rows][:, None]
    return (1 - FILL_WEIGHT) * out + (fill - before_fill)


def frag_delta(
    state: ClusterState,
    st: Stats,
    rows: Any,
    r: PackRequest,
    s: np.ndarray,
    gm: np.ndarray,
    fits: np.ndarray,
    *,
    quantize: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, chosen GPU) per row: growth of the mix's fragmentation if the request goes there."""
    g, valid = candidates(r, gm, fits)
    counts = after(st, rows, g, s)
    idle2 = np.broadcast_to((gm.sum(1) - r.gpus * s)[:, None], valid.shape)
    d = delta(
        st,
        rows,
        idle2,
        counts,
        state.cpus_free[rows] - r.cpus,
        state.mem_free_gb[rows] - r.mem_gb,
    )
    d = np.where(valid, d, _INF)
    if quantize:  # FGD's simulator scores int(100 * sigmoid(-growth in GPUs)): the rounding
        # makes near-equal GPUs and nodes tie; GPUs tie to the first, nodes to the node order
        z = np.exp(np.clip(d / MILLI, -50.0, 50.0))
        d = np.where(valid, -np.floor(100.0 / (1.0 + z)), _INF)
    choice = d.argmin(1)
    return d[np.arange(len(d)), choice], choice


def _best_gpu(
    state: ClusterState, st: Stats, rows: Any, gm: np.ndarray, s: np.ndarray
) -> np.ndarray:
    """The GPU a one-GPU share takes on each row: least fragmentation, then lowest index.

    Chosen with the CPUs and memory free now, whatever the request takes of them. GPUs with
    equal free milli leave equal after-states, so rows whose fitting GPUs are all alike (any
    whole-GPU request; empty nodes) take the first without scoring.
    """
    fits = gm >= s[:, None]
    c = fits.argmax(1)
    lo = np.where(fits, gm, 2 * MILLI).min(1)
    hi = np.where(fits, gm, -1).max(1)
    mixed = np.flatnonzero(lo < hi)
    if len(mixed):
        sub = mixed if isinstance(rows, slice) else rows[mixed]
        gmm, sm = gm[mixed], s[mixed]
        counts = after(st, sub, gmm[:, :, None], sm)
        idle2 = np.broadcast_to((gmm.sum(1) - sm)[:, None], gmm.shape)
        cpu, mem = state.cpus_free[sub], state.mem_free_gb[sub]
        d = delta(st, sub, idle2, counts, cpu, mem)
        d += LOSS_WEIGHT * slot_loss(st, gmm, sm[:, None])
        c[mixed] = np.where(fits[mixed], d, _INF).argmin(1)
    return c


def frag_score(
    state: ClusterState,
    st: Stats,
    r: PackRequest,
    policy: str,
    rows: Any,
    fitted: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...] | None]:
    """(score, chosen GPU, after-states) of the rows under ``fragmentation`` or ``fgd``.

    Score inf: no fit. ``fitted``: the rows' free milli, milli per GPU, GPUs with room and
    whether the node fits. The after-states of ``fragmentation`` ((2, R) frag and frag_fill
    of each row with the request placed, nan where it does not fit) let ``allocate`` skip
    refreshing the row it fills (``adopt``).
    """
    gm, s, fits, ok = fitted
    score = np.full(len(gm), _INF)
    choice = np.full(len(gm), -1, dtype=np.int64)
    # only rows that fit are scored: late in a busy cluster most rows are full
    sel = np.flatnonzero(ok)
    if not len(sel):
        return score, choice, None
    sub = sel if isinstance(rows, slice) else rows[sel]
    if policy == "fragmentation":
        gms, ss = gm[sel], s[sel]
        if r.gpus == 1 and gms.shape[1] > 1:
            c = _best_gpu(state, st, sub, gms, ss)
            g = gms[np.arange(len(gms)), c][:, None, None]
            choice[sel] = c
        else:
            g, _ = candidates(r, gms, gms >= ss[:, None])
        counts = after(st, sub, g, ss)[:, 0]
        cpu2, mem2 = state.cpus_free[sub] - r.cpus, state.mem_free_gb[sub] - r.mem_gb
        frag, fill = measures(st, sub, gms.sum(1) - r.gpus * ss, counts, cpu2, mem2)
        d = _growth(st, sub, frag, fill)
        if r.gpus and ss.min() < MILLI:  # whole GPUs lose nothing: they take a GPU's all
            d += LOSS_WEIGHT * slot_loss(st, g[:, 0], ss[:, None]).sum(1)
        score[sel] = d
        states = np.full((2, len(gm)), np.nan)
        states[0, sel], states[1, sel] = frag, fill
        return score, choice, states
    score[sel], choice[sel] = frag_delta(
        state, st, sub, r, s[sel], gm[sel], fits[sel], quantize=True
    )
    return score, choice, None
