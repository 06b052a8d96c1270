"""The shape mix: which request shapes the packer keeps room for, and how much each weighs.

Free GPU share is counted in integer thousandths of a GPU (``MILLI``) so that sums never drift.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError

if TYPE_CHECKING:
    from .state import PackRequest

MILLI = 1000  # free GPU share is kept in integer thousandths of a GPU


@dataclass(frozen=True, eq=False)
class ShapeMix:
    """The task shapes a fragmentation policy keeps room for, with their weights.

    Compared by identity: the state caches per-node statistics per mix object, so keep one
    object for as long as the mix holds.
    """

    shapes: tuple[PackRequest, ...]
    weights: tuple[float, ...]
    #: (allowed models, share of all requested GPUs) of every model-constrained request group:
    #: tells the packer which models constrained work depends on (not cut by coverage)
    model_demand: tuple[tuple[tuple[str, ...], float], ...] = ()
    #: (milli per GPU, GPUs requested at that size) over all requests (not cut by coverage):
    #: what ``slot_value`` prices; empty = taken from ``shapes`` and ``weights``
    gpu_sizes: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_requests(
        cls,
        requests: Iterable[PackRequest],
        *,
        coverage: float = 0.95,
        weigh: str = "count",
        ignore_mem: bool = False,
    ) -> ShapeMix:
        """The most common shapes covering ``coverage`` of the requests.

        ``weigh="count"`` weights shapes by frequency (FGD); ``"gpus"`` by GPUs they request,
        so that rare multi-GPU jobs weigh what they occupy. ``ignore_mem`` drops host memory
        from the shape (FGD's shapes check CPU only).
        """
        if weigh not in ("count", "gpus"):
            raise InvalidSpecError("weigh", f"must be 'count' or 'gpus', not {weigh!r}")
        seen: dict[PackRequest, int] = {}  # a trace repeats few shapes: normalise each once
        for r in requests:
            seen[r] = seen.get(r, 0) + 1
        counts: dict[PackRequest, float] = {}
        for r, n in seen.items():
            key = replace(  # the request's own class: no import of the packer here
                r,
                gpu_share=r.gpu_share if r.gpus else 0.0,
                gpu_mem_gb=r.gpu_mem_gb if r.gpus else None,
                mem_gb=0 if ignore_mem else r.mem_gb,
                models=tuple(sorted(set(r.models))) if r.gpus else (),
            )
            counts[key] = counts.get(key, 0.0) + n
        return weighted_mix(counts, coverage, weigh)


def gpu_mass(s: PackRequest) -> float:
    """GPUs a request takes (shares count as fractions; memory-sized ones as whole GPUs)."""
    return s.gpus * (s.gpu_share if s.gpu_mem_gb is None else 1.0)


def weighted_mix(
    counts: dict[PackRequest, float], coverage: float = 0.95, weigh: str = "gpus"
) -> ShapeMix:
    """Mix from shape -> count, keeping the most common shapes covering ``coverage``."""
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    total = sum(counts.values())
    kept: list[tuple[PackRequest, float]] = []
    seen = 0.0
    for shape, n in ranked:
        if kept and seen >= coverage * total:
            break
        kept.append((shape, n * max(gpu_mass(shape), 0.1) if weigh == "gpus" else n))
        seen += n
    mass = sum(n * gpu_mass(s) for s, n in counts.items())
    demand: dict[tuple[str, ...], float] = {}
    for s, n in counts.items():
        if s.models and s.gpus:
            demand[s.models] = demand.get(s.models, 0.0) + n * gpu_mass(s) / max(mass, 1e-12)
    return ShapeMix(
        tuple(s for s, _ in kept),
        tuple(w for _, w in kept),
        tuple(sorted(demand.items())),
        _gpu_sizes(counts.items()),
    )


def _gpu_sizes(counts: Iterable[tuple[PackRequest, float]]) -> tuple[tuple[int, float], ...]:
    """(milli per GPU, GPUs requested) of shapes sized in shares (memory-sized ones vary)."""
    sizes: dict[int, float] = {}
    for s, n in counts:
        if s.gpus and s.gpu_mem_gb is None and n > 0:
            milli = min(int(np.ceil(round(s.gpu_share * MILLI, 6))), MILLI)
            sizes[milli] = sizes.get(milli, 0.0) + n * s.gpus
    return tuple(sorted(sizes.items()))
