"""What a GPU's free share is worth to the shape mix: prices from the fluid bin-packing LP.

The fragmentation policy charges a GPU share for what it loses for good on the GPU it lands
on (``slot_loss``); ``slot_value`` prices every free amount once per mix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .mix import MILLI, ShapeMix, _gpu_sizes

if TYPE_CHECKING:
    from .fragmentation import Stats


# -- what a GPU's free share is worth: prices from the fluid bin-packing LP --------------------
#: the most requested GPU sizes priced by ``slot_value`` (rarer sizes read what fits in them);
#: keeps the LP small for a live cluster that sees endless shapes
MAX_PRICED_SIZES = 32


def slot_value(mix: ShapeMix) -> np.ndarray:
    """Worth (in milli) of a GPU with v milli free, v = 0..MILLI, to the mix's requests.

    It is the most the requests could still put there, each priced at what it costs in a
    best packing.

    Prices come from the fluid bin-packing LP of the mix's GPU sizes (GPUs are bins; a whole
    GPU costs MILLI): the LP dual ``pi`` (max ``counts . pi`` with every set of sizes that fits
    one GPU worth at most MILLI) says how much of a GPU each size uses up when GPUs are packed
    as well as they can be. A 0.81 GPU request then costs a whole GPU (little else fits beside
    it), a 0.47 half, a 0.32 a third. The worth of v free milli is the best set of sizes that
    fits (a knapsack), so ``value[v] - value[s] - value[v - s]`` (>= 0) is what putting an s-milli
    share on that GPU loses for good, e.g. a 0.32 on a GPU holding a 0.47 leaves 0.21 that only
    rare small shares can use, where a fresh GPU keeps room for a 0.65 or two more 0.32s.
    """
    sizes = mix.gpu_sizes or _gpu_sizes(zip(mix.shapes, mix.weights, strict=True))
    kept = sorted(sizes, key=lambda sn: -sn[1])[:MAX_PRICED_SIZES]
    if not kept:
        return np.zeros(MILLI + 1)
    kept.sort()
    size = [max(int(k), 1) for k, _ in kept]
    count = np.array([n for _, n in kept], dtype=np.float64)
    count /= count.sum()
    rows = [np.eye(len(size))[j] * (MILLI // k) for j, k in enumerate(size)]
    for _ in range(100):  # cutting planes: add the set of sizes the prices undervalue most
        pi = _lp_max(np.array(rows), count)
        best, fill = _knapsack(size, pi)
        if best[MILLI] <= 1.0 + 1e-9:
            break
        rows.append(fill)
    best, _ = _knapsack(size, pi / max(best[MILLI], 1.0))
    return best * MILLI


def _knapsack(size: list[int], value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Most value that fits in each free milli 0..MILLI (sizes reusable), and the fill of MILLI.

    Item by item, in strides of the item's size: a stride reads only the one before it.
    """
    best = np.zeros(MILLI + 1)
    for k, v in zip(size, value.tolist(), strict=True):
        for c in range(k, MILLI + 1, k):
            e = min(c + k, MILLI + 1)
            np.maximum(best[c:e], best[c - k : e - k] + v, out=best[c:e])
    fill = np.zeros(len(size))
    c = MILLI
    while c > 0:  # walk back one best fill of a whole GPU
        for j, k in enumerate(size):
            if k <= c and best[c - k] + value[j] >= best[c] - 1e-12:
                fill[j] += 1
                c -= k
                break
        else:
            c -= 1
    return best, fill


def _lp_max(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Maximise c.x subject to a x <= 1, x >= 0 (bounded: every size fits some row).

    Solved with HiGHS directly (``highspy``, ~12 MB) rather than through scipy (~110 MB).
    """
    import highspy  # imported here: only mixes of GPU shares need it

    rows, cols = a.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = cols, rows
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.col_cost_ = c.astype(np.float64)
    lp.col_lower_ = np.zeros(cols)
    lp.col_upper_ = np.full(cols, highspy.kHighsInf)
    lp.row_lower_ = np.full(rows, -highspy.kHighsInf)
    lp.row_upper_ = np.ones(rows)
    at = np.asarray(a, dtype=np.float64).T  # column by column: HiGHS's compressed columns
    nz = at != 0
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate(([0], np.cumsum(nz.sum(1)))).astype(np.int32)
    lp.a_matrix_.index_ = np.nonzero(nz)[1].astype(np.int32)
    lp.a_matrix_.value_ = at[nz]
    h = _quiet_highs(highspy)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # pragma: no cover - x = 0
        # is feasible and every size fits some row, so the LP is bounded
        raise RuntimeError(f"pricing GPU sizes failed: {h.modelStatusToString(h.getModelStatus())}")
    return np.maximum(np.asarray(h.getSolution().col_value, dtype=np.float64), 0.0)


def _quiet_highs(highspy: Any) -> Any:
    """A HiGHS solver that prints nothing, its banner included.

    ``highspy.Highs()`` prints "Running HiGHS ..." on stdout while it is built (its callbacks
    start logging), before any option can be set: ``simulate --json`` was then no JSON and
    every service start logged it. The core class it wraps starts quiet; we use no callbacks.
    """
    core = getattr(getattr(highspy, "_core", None), "_Highs", None)
    h = core() if core is not None else highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def slot_loss(st: Stats, free: np.ndarray, take: np.ndarray) -> np.ndarray:
    """Worth lost for good by taking ``take`` milli from GPUs with ``free`` milli (broadcast)."""
    take = np.minimum(take, MILLI)
    return st.value[free] - st.value[take] - st.value[np.maximum(free - take, 0)]
