"""One pass placing many requests in turn: nodes in equal states are scored once, as a class.

``pack_many`` puts each request where ``pack`` would, given every placement before it. At
cluster scale most nodes share a few states (empty, full, holding one job of a common shape),
so the pass keeps the nodes grouped by state: a *class* is a node shape (model, GPUs, NVLink
islands, CPUs, memory) with its free milli per GPU, free CPUs and memory, and whether it is up.

- A class's score for a request is computed once (``scoring.score_rows`` on one member) and
  kept in a heap per distinct request: the best node is in the top class, and in it the first
  of the seeded order (``random`` ties hash the tied classes' nodes, as ``pack`` does).
- A request placed on a class always takes the same GPUs and leaves the node in the same next
  class: found once, then looked up.
- A request that fits nowhere names the node with the most room, found among classes.

The state's arrays are written at each placement as ``allocate`` writes them, so the state, its
caches and ``pack`` stay exact throughout. A request whose score moves with every placement
anywhere (``fragmentation`` with model-constrained work in the mix: a model's GPUs cost more as
fewer are idle) goes through ``pack`` and ``allocate``, and its node is re-filed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mix import MILLI, ShapeMix
from .scoring import (
    TIE,
    all_down,
    hosts,
    new_fit,
    no_room,
    pick_gpus,
    score_rows,
    tie_hash,
    validate,
)
from .state import ClusterState, PackReply, PackRequest, _Fit

_FRAG = ("fragmentation", "fgd")


@dataclass
class _Shape:
    """One distinct request of the pass: its class scores, heaps and cached answers."""

    r: PackRequest
    fit: _Fit  # what it takes per GPU on each node, and where it may go
    mix: ShapeMix | None = None  # the mix the scores below are for
    score: dict[int, float] = field(default_factory=dict)  # class -> score (inf: cannot go)
    choice: dict[int, int] = field(default_factory=dict)  # class -> GPU of a one-GPU request
    heap: list[tuple[float, int]] = field(default_factory=list)  # (score, class)
    inheap: set[int] = field(default_factory=set)  # classes with an entry on ``heap``
    seen: int = 0  # entries of the pass's ``live`` log already looked at
    moves: dict[int, tuple[int, tuple[int, ...], float]] = field(default_factory=dict)
    room: list[tuple[float, int]] = field(default_factory=list)  # (-room, class) hosts
    inroom: set[int] = field(default_factory=set)
    room_seen: int = 0
    hosts: tuple[np.ndarray, str, str | None] | None = None  # ``scoring.hosts``
    host_sigs: tuple[frozenset[int], int] = (frozenset(), 0)  # (signatures of hosts, up nodes)
    failed: dict[tuple[int, int], PackReply] = field(default_factory=dict)


class Pass:
    """The classes of a state's nodes, kept up to date while a pass places requests."""

    def __init__(self, state: ClusterState, policy: str, tie_break: str, seed: int) -> None:
        self.state, self.policy, self.seed = state, policy, seed
        self.random = tie_break == "random"
        self.rank: list[int] = state.order_rank(seed).tolist()
        self.node_sig = _signatures(state)
        self.keys: dict[tuple[Any, ...], int] = {}
        # per class: signature, free milli per GPU, CPUs, GB, up, most-room key, node count,
        # heaps of (rank, node) and of node index (entries go stale when a node moves on)
        self.sig: list[int] = []
        self.row: list[np.ndarray] = []
        self.cpu: list[float] = []
        self.mem: list[float] = []
        self.up: list[bool] = []
        self.roomv: list[float] = []
        self.count: list[int] = []
        self.by_rank: list[list[tuple[int, int]]] = []
        self.by_index: list[list[int]] = []
        self.live: list[int] = []  # classes in the order they gained a first node
        self.cls: list[int] = [0] * state.n_nodes
        self.cls_np = np.zeros(state.n_nodes, dtype=np.int64)  # the same, for random ties
        self.shapes: dict[PackRequest, _Shape] = {}
        self.by_id: dict[int, tuple[PackRequest, _Shape]] = {}
        self._file_all()

    # -- classes --------------------------------------------------------------------------------
    def _file_all(self) -> None:
        """Group every node by state (one sort over the columns, as ``unique_rows``)."""
        s = self.state
        key = np.column_stack(
            (self.node_sig, s.node_up, s.cpus_free, s.mem_free_gb, s.gm.astype(np.float64))
        )
        order = np.lexsort(key.T)
        ks = key[order]
        starts = np.flatnonzero(np.r_[True, (ks[1:] != ks[:-1]).any(1)])
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(order)], strict=True):
            nodes = order[a:b].tolist()
            i = nodes[0]
            c = self._intern(
                int(self.node_sig[i]),
                s.gm[i].copy(),
                float(s.cpus_free[i]),
                float(s.mem_free_gb[i]),
                bool(s.node_up[i]),
            )
            self.count[c] = len(nodes)
            self.by_rank[c] = sorted((self.rank[j], j) for j in nodes)  # sorted: a heap
            self.by_index[c] = sorted(nodes)
            for j in nodes:
                self.cls[j] = c
            self.cls_np[nodes] = c
            self.live.append(c)

    def _intern(self, sig: int, row: np.ndarray, cpu: float, mem: float, up: bool) -> int:
        key = (sig, row.tobytes(), cpu, mem, up)
        c = self.keys.get(key)
        if c is None:
            c = self.keys[key] = len(self.sig)
            row.flags.writeable = False
            self.sig.append(sig)
            self.row.append(row)
            self.cpu.append(cpu)
            self.mem.append(mem)
            self.up.append(up)
            self.roomv.append(float((row == MILLI).sum()) * 1e6 + float(row.sum()))
            self.count.append(0)
            self.by_rank.append([])
            self.by_index.append([])
        return c

    def _move(self, i: int, c2: int) -> None:
        c = self.cls[i]
        if c2 == c:
            return
        self.cls[i] = c2
        self.count[c] -= 1
        if not self.count[c2]:
            self.live.append(c2)
        self.count[c2] += 1
        heapq.heappush(self.by_rank[c2], (self.rank[i], i))
        heapq.heappush(self.by_index[c2], i)
        if self.random:
            self.cls_np[i] = c2

    def refile(self, i: int) -> None:
        """Re-file node ``i`` from the state's arrays (after a change made outside the pass)."""
        s = self.state
        c2 = self._intern(
            int(self.node_sig[i]),
            s.gm[i].copy(),
            float(s.cpus_free[i]),
            float(s.mem_free_gb[i]),
            bool(s.node_up[i]),
        )
        self._move(i, c2)

    def _first(self, c: int) -> int:
        """The class's node first in the seeded order (stale heap entries dropped)."""
        h, cls = self.by_rank[c], self.cls
        while cls[h[0][1]] != c:
            heapq.heappop(h)
        return h[0][1]

    def _lowest(self, c: int) -> int:
        h, cls = self.by_index[c], self.cls
        while cls[h[0]] != c:
            heapq.heappop(h)
        return h[0]

    # -- scores ---------------------------------------------------------------------------------
    def shape(self, r: PackRequest) -> _Shape:
        """The pass's record of a request (by identity first: hashing a request costs)."""
        hit = self.by_id.get(id(r))
        if hit is not None and hit[0] is r:
            return hit[1]
        sh = self.shapes.get(r)
        if sh is None:
            validate(r)
            sh = self.shapes[r] = _Shape(r, new_fit(self.state, r))
        self.by_id[id(r)] = (r, sh)  # keeps r alive, so its id is not reused in the pass
        return sh

    def _score(self, sh: _Shape, classes: list[int]) -> None:
        rows = np.array([self._first(c) for c in classes], dtype=np.int64)
        score, choice, _ = score_rows(self.state, sh.fit, sh.r, self.policy, sh.mix, rows)
        for c, v, g in zip(classes, score.tolist(), choice.tolist(), strict=True):
            sh.score[c] = v
            sh.choice[c] = g

    def _sync(self, sh: _Shape, mix: ShapeMix | None) -> None:
        """Push the classes that gained a node since the shape last looked (all, on a new mix)."""
        live = self.live
        if sh.mix is not mix:  # scores, GPU choices and moves all depend on the mix
            sh.mix, sh.heap = mix, []
            for d in (sh.score, sh.choice, sh.moves, sh.inheap):
                d.clear()
            new = [c for c, n in enumerate(self.count) if n]
        else:
            new = live[sh.seen :]
        sh.seen = len(live)
        count, score, inheap, heap = self.count, sh.score, sh.inheap, sh.heap
        todo = [c for c in new if c not in score and count[c]]
        if todo:
            self._score(sh, list(dict.fromkeys(todo)) if len(todo) > 1 else todo)
        for c in new:
            if c not in inheap and count[c] and score[c] < np.inf:
                heapq.heappush(heap, (score[c], c))
                inheap.add(c)

    def _tied(self, heap: list[tuple[float, int]], inheap: set[int], limit: float) -> list[int]:
        """Live classes within the tie tolerance of the best (heap entries put back)."""
        got: list[tuple[float, int]] = []
        count = self.count
        while heap and heap[0][0] <= limit:
            e = heapq.heappop(heap)
            if count[e[1]]:
                got.append(e)
            else:
                inheap.discard(e[1])
        for e in got:
            heapq.heappush(heap, e)
        return [c for _, c in got]

    # -- placing --------------------------------------------------------------------------------
    def place(self, sh: _Shape, mix: ShapeMix | None) -> PackReply:
        """Where ``pack`` would put the request; the placement is applied to the state."""
        if sh.mix is not mix or sh.seen != len(self.live):
            self._sync(sh, mix)
        heap, count, inheap = sh.heap, self.count, sh.inheap
        while heap and not count[heap[0][1]]:
            inheap.discard(heapq.heappop(heap)[1])
        if not heap:
            return self._fail(sh)
        best, c = heap[0]
        limit = best + TIE
        if self.random:
            tied = self._tied(heap, inheap, limit)
            if len(tied) == 1 and count[c] == 1:  # one node: no draw
                i = self._first(c)
            else:
                cand = np.flatnonzero(
                    self.cls_np == tied[0] if len(tied) == 1 else np.isin(self.cls_np, tied)
                )
                i = int(cand[np.argmin(tie_hash(self.seed, self.state.step, cand))])
                c = self.cls[i]
        elif (len(heap) > 1 and heap[1][0] <= limit) or (len(heap) > 2 and heap[2][0] <= limit):
            rank = self.rank
            tied = self._tied(heap, inheap, limit)
            i = min((self._first(t) for t in tied), key=rank.__getitem__)
            c = self.cls[i]
        else:
            i = self._first(c)
        move = sh.moves.get(c)
        if move is None:
            move = sh.moves[c] = self._next(sh, c, i)
        c2, gpus, share = move
        s = self.state
        s.gm[i] = self.row[c2]
        s.cpus_free[i] = self.cpu[c2]
        s.mem_free_gb[i] = self.mem[c2]
        s._touch(i)
        self._move(i, c2)
        r = sh.r
        return PackReply(
            i, s.node_names[i], gpus, share, None, True, float(r.cpus), float(r.mem_gb), best
        )

    def _next(self, sh: _Shape, c: int, i: int) -> tuple[int, tuple[int, ...], float]:
        """(next class, GPUs taken, share of each) of a request placed on a node of class c."""
        r = sh.r
        milli = int(sh.fit.s[i])
        gpus = pick_gpus(self.state, i, r, milli, sh.choice[c])
        row = self.row[c].copy()
        row[list(gpus)] -= milli
        c2 = self._intern(
            self.sig[c], row, self.cpu[c] - float(r.cpus), self.mem[c] - float(r.mem_gb), self.up[c]
        )
        return c2, gpus, milli / MILLI if gpus else 0.0

    def _fail(self, sh: _Shape) -> PackReply:
        """The reply ``pack`` gives when nothing fits: most room among the possible hosts."""
        r = sh.r
        if sh.hosts is None:
            sh.hosts = cand, _, never = hosts(self.state, r)
            if never is None:
                up = cand & self.state.node_up
                sh.host_sigs = (frozenset(self.node_sig[cand].tolist()), int(up.sum()))
        cand, what, never = sh.hosts
        if never is not None:
            return PackReply(None, None, (), 0.0, never, False, r.cpus, r.mem_gb)
        sigs, n_up = sh.host_sigs
        if not n_up:
            reason = all_down(self.state, cand)
            return PackReply(None, None, (), 0.0, reason, True, r.cpus, r.mem_gb)
        count, live, heap, inroom = self.count, self.live, sh.room, sh.inroom
        for c in live[sh.room_seen :]:
            if c not in inroom and count[c] and self.up[c] and self.sig[c] in sigs:
                heapq.heappush(heap, (-self.roomv[c], c))
                inroom.add(c)
        sh.room_seen = len(live)
        while not count[heap[0][1]]:
            inroom.discard(heapq.heappop(heap)[1])
        most = heap[0][0]  # ties are exact: room is integral
        j = min(self._lowest(c) for c in self._tied(heap, inroom, most))
        key = (j, self.cls[j])
        reply = sh.failed.get(key)
        if reply is None:
            reason = no_room(self.state, r, what, n_up, j)
            reply = sh.failed[key] = PackReply(None, None, (), 0.0, reason, True, r.cpus, r.mem_gb)
        return reply


def _signatures(state: ClusterState) -> np.ndarray:
    """(N,) id of each node's fixed shape: nodes with one id score alike in equal states."""
    key = np.column_stack(
        (
            state.model_id,
            state.gpu_mem_gb,
            state.gpu_count,
            state.cpus_total,
            state.mem_total_gb,
            state.nvlink,
        )
    )
    return np.unique(key, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def place_all(
    state: ClusterState,
    requests: Iterable[PackRequest],
    *,
    policy: str,
    tie_break: str,
    seed: int,
    shape_mix: ShapeMix | None,
    pack_one: Callable[..., PackReply],
) -> list[PackReply]:
    """Place requests in turn as ``pack`` + ``allocate`` would (``packer.pack_many``)."""
    p: Pass | None = None
    replies = []
    frag = policy in _FRAG
    for r in requests:
        if shape_mix is None:
            state.record_arrival(r)
        mix = shape_mix if frag else None
        if mix is None and frag:
            mix = state.arrival_mix() or state._default_mix()
        if policy == "fragmentation" and mix is not None and mix.model_demand and r.gpus:
            # the price of a model's GPUs follows how many are idle: every score moves
            reply = pack_one(state, r, policy=policy, tie_break=tie_break, seed=seed, shape_mix=mix)
            if reply.node is not None:
                state.allocate(reply)
                if p is not None:
                    p.refile(reply.node)
        else:
            if p is None:
                p = Pass(state, policy, tie_break, seed)
            reply = p.place(p.shape(r), mix)
        replies.append(reply)
    return replies
