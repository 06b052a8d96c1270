"""What the free capacity is worth: the price of constrained models' GPUs, and the figures.

``model_pressure`` is the fragmentation policy's extra cost for taking GPUs that
model-constrained work depends on; ``metrics`` reports how usable the free capacity is, from
the same arrays the packer uses. Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .fragmentation import stats_for
from .mix import MILLI, ShapeMix

if TYPE_CHECKING:
    from .state import ClusterState


def model_pressure(state: ClusterState, mix: ShapeMix) -> np.ndarray:
    """Cost per GPU-milli taken on each model: how much constrained work leans on its idle GPUs.

    A group of requests that may run only on some models, with a share ``w`` of all GPU demand,
    makes each idle GPU of those models worth ``w * idle / idle of those models`` extra: taking
    such a GPU for work that could go elsewhere costs the group more as its supply runs low.
    """
    idle = np.where(state.node_up, state.gm.sum(1), 0)
    by_model = np.bincount(state.model_id, weights=idle, minlength=len(state.models))
    total = max(by_model.sum(), 1.0)
    value = np.zeros(len(state.models))
    for models, w in mix.model_demand:
        which = state._models_of(models)
        value[which] += w * total / max(by_model[which].sum(), MILLI)
    return value


@dataclass
class FragMetrics:
    """How usable the free capacity is (shares are of the GPUs on up nodes)."""

    allocated_share: float
    unallocated_share: float
    free_nodes_by_size: dict[int, int]  # GPUs per node -> nodes with every GPU wholly free
    largest_placeable_gpus: int  # most whole free GPUs on one up node
    frag_ratio: float  # share of the free GPU capacity the shape mix cannot use (FGD)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "allocated_share": self.allocated_share,
            "unallocated_share": self.unallocated_share,
            "free_nodes_by_size": {str(k): v for k, v in self.free_nodes_by_size.items()},
            "largest_placeable_gpus": self.largest_placeable_gpus,
            "frag_ratio": self.frag_ratio,
        }


def metrics(state: ClusterState, shape_mix: ShapeMix | None = None) -> FragMetrics:
    """Fragmentation figures of the up nodes, from the same arrays the packer uses."""
    up = state.node_up
    total = int(state.gpu_count[up].sum()) * MILLI
    free = int(state.gm[up].sum())
    whole = (state.gm == MILLI).sum(1)
    empty = up & (whole == state.gpu_count) & (state.gpu_count > 0)
    by_size: dict[int, int] = {}
    for g in state.gpu_count[empty]:
        by_size[int(g)] = by_size.get(int(g), 0) + 1
    mix = shape_mix or state.arrival_mix() or state._default_mix()
    frag = float(
        stats_for(state, mix, False).frag[up].sum()
    )  # FGD's measure, comparable across policies
    alloc = 1.0 - free / total if total else 0.0
    return FragMetrics(
        alloc,
        1.0 - alloc if total else 0.0,
        dict(sorted(by_size.items())),
        int(whole[up].max()) if up.any() else 0,
        frag / free if free else 0.0,
    )
