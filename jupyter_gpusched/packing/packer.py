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
The shape-mix scoring and its statistics live in ``fragmentation``, the figures in
``metrics``, how each policy scores rows, picks GPUs and explains a miss in ``scoring``.
``pack_many`` places a queue in one pass that scores nodes in equal states once (``batch``),
with the replies of ``pack`` + ``allocate`` request by request. No I/O, no clock; randomness
only from the seed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np

from jupyter_gpusched.core.errors import InvalidSpecError

from .batch import place_all
from .fragmentation import FILL_WEIGHT as FILL_WEIGHT
from .metrics import FragMetrics as FragMetrics
from .metrics import metrics as metrics
from .metrics import model_pressure
from .mix import MILLI as MILLI
from .mix import ShapeMix as ShapeMix
from .scoring import TIE, explain, fit, offer, pick_gpus, tie_hash, validate
from .state import ClusterState as ClusterState
from .state import NodeShape as NodeShape
from .state import PackReply as PackReply
from .state import PackRequest as PackRequest

POLICIES = ("first_fit", "best_fit", "spread", "dot_product", "fragmentation", "fgd")
TIE_BREAKS = ("order", "random")
_INF = np.inf


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
    validate(request)
    _check(policy, tie_break)
    mix = shape_mix
    if mix is None and policy in ("fragmentation", "fgd"):
        mix = state.arrival_mix() or state._default_mix()
    f = fit(state, request, policy, mix)
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
        reason, ever = explain(state, request)
        return PackReply(None, None, (), 0.0, reason, ever, request.cpus, request.mem_gb)
    cand = np.flatnonzero(score <= best + TIE)
    i = int(cand[0])
    if len(cand) > 1:
        key = (
            state.order_rank(seed)[cand]
            if tie_break == "order"
            else tie_hash(seed, state.step, cand)
        )
        i = int(cand[np.argmin(key)])
    s = int(f.s[i])
    gpus = pick_gpus(state, i, request, s, int(f.choice[i]))
    reply = PackReply(
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
    if policy == "fragmentation" and mix is not None:
        offer(state, f, mix, reply)
    return reply


def pack_many(
    state: ClusterState,
    requests: Iterable[PackRequest],
    *,
    policy: str = "fragmentation",
    tie_break: str = "order",
    seed: int = 0,
    shape_mix: ShapeMix | None = None,
) -> list[PackReply]:
    """Place requests one by one in the given order, applying each placement to ``state``.

    Each goes where ``pack`` would put it given the placements before it (then ``allocate``);
    the pass scores nodes in equal states once (``batch``), which at cluster scale is most of
    them. Without ``shape_mix`` each request is first recorded as an arrival.
    """
    _check(policy, tie_break)
    return place_all(
        state,
        requests,
        policy=policy,
        tie_break=tie_break,
        seed=seed,
        shape_mix=shape_mix,
        pack_one=pack,
    )


def _check(policy: str, tie_break: str) -> None:
    if policy not in POLICIES:
        raise InvalidSpecError("policy", f"unknown policy {policy!r}; choose from {POLICIES}")
    if tie_break not in TIE_BREAKS:
        raise InvalidSpecError("tie_break", f"must be 'order' or 'random', not {tie_break!r}")
