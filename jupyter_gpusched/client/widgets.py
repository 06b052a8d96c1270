"""``%gpu status``: the cluster as an ipywidgets view, updated from the server's events.

:class:`ClusterMap` keeps its meaning in synced traits (``nodes``, ``metrics``, ``window``,
``queue``) computed from the API's models by :meth:`ClusterMap.apply_cluster` and
:meth:`ClusterMap.apply_event`, so the logic is tested through ``get_state()`` with no kernel.
The children are plain HTML widgets rendered from those traits: a node x GPU map coloured by
state (the lab panel's colours) with a memory fill and hover details, the fragmentation
figures, the window in force, and the queue.

Live updates come from the events websocket (tornado, on the kernel's running asyncio loop);
a job event that moves GPUs triggers one debounced ``GET cluster``. No polling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from typing import Any

import ipywidgets as widgets
from traitlets import Bool, Dict, Int, List, Unicode, observe

from jupyter_gpusched.core.api import Cluster, EventMessage, Gpu, JobView, Node
from jupyter_gpusched.core.models import JobState
from jupyter_gpusched.core.units import format_size_gb

log = logging.getLogger(__name__)

#: GPU state -> colour; the JupyterLab panel uses the same.
COLOURS = {
    "free": "#e0e0e0",
    "interactive": "#2e7d32",
    "batch": "#1565c0",
    "foreign": "#ef6c00",
    "down": "#c62828",
}
_LIVE = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
#: Event kinds that cannot change which GPUs are taken.
_QUIET_KINDS = frozenset({"activity", "waiting", "submitted", "updated"})


def gpu_title(node: Node, gpu: Gpu) -> str:
    """Hover text of one GPU: where, state, jobs and owners, memory, utilization."""
    state = gpu.state if node.up else "down"
    lines = [f"{node.name} GPU {gpu.index} ({gpu.model})", f"state: {state}"]
    for job in gpu.jobs:
        part = f", {job.share:.0%} of the GPU" if job.share < 1 else ""
        lines.append(f"job {job.id} ({job.kind.value}) by {job.user}{part}")
    used, total = round(gpu.mem_used_gb, 1), round(gpu.mem_total_gb, 1)
    lines.append(f"memory {format_size_gb(used)} / {format_size_gb(total)}")
    lines.append(f"utilization {gpu.util_pct:.0f}%")
    if not node.up and node.error:
        lines.append(f"node down: {node.error}")
    return "\n".join(lines)


def _gpu_entry(node: Node, gpu: Gpu) -> dict[str, Any]:
    state = gpu.state if node.up else "down"
    total, used = gpu.mem_total_gb, gpu.mem_used_gb
    return {
        "index": gpu.index,
        "model": gpu.model,
        "state": state,
        "colour": COLOURS.get(state, COLOURS["free"]),
        "mem_fill": round(min(1.0, used / total), 3) if total else 0.0,
        "mem_used_gb": used,
        "mem_total_gb": total,
        "util_pct": gpu.util_pct,
        "jobs": [j.id for j in gpu.jobs],
        "title": gpu_title(node, gpu),
    }


def _queue_entry(job: JobView) -> dict[str, Any]:
    spec = job.spec
    return {
        "id": job.id,
        "user": job.user,
        "kind": spec.kind.value,
        "state": job.state.value,
        "gpus": spec.gpus,
        "node": job.placement.node if job.placement else None,
        "position": job.position,
        "reason": job.reason,
        "name": spec.name or " ".join(spec.command or []) or "",
    }


class ClusterMap(widgets.VBox):
    """Node x GPU map, fragmentation figures, window and queue of one gpusched server."""

    nodes = List(
        help="One dict per node: name, up, error, gpus (state, colour, mem_fill 0-1, jobs, title)."
    ).tag(sync=True)
    metrics = Dict(
        help="Fragmentation figures of GET cluster (free_nodes_by_size, "
        "largest_placeable_gpus, frag_ratio, allocated_share, gpus_free...)."
    ).tag(sync=True)
    window = Dict(
        help="The policy window in force (GET cluster's window): name, until, next_window, rules."
    ).tag(sync=True)
    queue = List(help="Live jobs (queued, starting, running), queued first in queue order.").tag(
        sync=True
    )
    last_event_id = Int(0, help="Id of the last event applied; reconnects resume after it.").tag(
        sync=True
    )
    connected = Bool(False, help="Whether the events websocket is open.").tag(sync=True)
    error = Unicode("", help="Why the view may be stale (server unreachable...).").tag(sync=True)

    def __init__(self, client: Any = None, **kwargs: Any) -> None:
        self._map = widgets.HTML()
        self._figures = widgets.HTML()
        self._window = widgets.HTML()
        self._queue = widgets.HTML()
        super().__init__(children=[self._map, self._figures, self._window, self._queue], **kwargs)
        self.client = client
        self._jobs: dict[int, JobView] = {}
        self._task: asyncio.Task[None] | None = None
        self._refresh_pending = False
        self._render_map()
        self._render_figures()
        self._render_window()
        self._render_queue()

    # ------------------------------------------------------------------ model logic

    def apply_cluster(self, cluster: Cluster) -> None:
        """Take a ``GET cluster`` body (or a ``cluster`` event's) as the new state."""
        nodes = [
            {
                "name": n.name,
                "up": n.up,
                "error": n.error,
                "gpus": [_gpu_entry(n, g) for g in n.gpus],
            }
            for n in cluster.nodes
        ]
        with self.hold_trait_notifications():
            self.nodes = nodes
            self.metrics = cluster.metrics.model_dump(mode="json")
            self.window = cluster.window.model_dump(mode="json")

    def apply_jobs(self, jobs: list[JobView]) -> None:
        """Take a list of jobs (``GET jobs``) as the live ones."""
        self._jobs = {j.id: j for j in jobs if j.state in _LIVE}
        self._update_queue()

    def apply_event(self, event: EventMessage) -> bool:
        """Apply one websocket event; True when the GPU map should be fetched again."""
        self.last_event_id = max(self.last_event_id, event.id or 0)
        if event.cluster is not None:
            self.apply_cluster(event.cluster)
            return False
        if event.job is not None:
            if event.job.state in _LIVE:
                self._jobs[event.job.id] = event.job
            else:
                self._jobs.pop(event.job.id, None)
            self._update_queue()
        return event.kind not in _QUIET_KINDS

    def _update_queue(self) -> None:
        def order(job: JobView) -> tuple[int, int, int]:
            queued = job.state is JobState.QUEUED
            return (0 if queued else 1, job.position or 10**9, job.id)

        queue = [_queue_entry(j) for j in sorted(self._jobs.values(), key=order)]
        if queue != self.queue:
            self.queue = queue

    # ------------------------------------------------------------------ live

    def refresh(self) -> None:
        """Fetch cluster and live jobs now (blocking; the initial picture)."""
        if self.client is None:
            return
        try:
            self.apply_cluster(self.client.cluster())
            page = self.client.list_jobs(state=[s.value for s in _LIVE], limit=1000)
            self.apply_jobs(page.jobs)
            self.error = ""
        except Exception as exc:  # noqa: BLE001 - shown in the widget, not raised into a cell
            self.error = f"cannot reach the server: {getattr(exc, 'message', exc)}"

    def follow(self) -> bool:
        """Follow the events websocket on the running loop; False when there is none."""
        if self.client is None or (self._task is not None and not self._task.done()):
            return False
        try:
            loop = asyncio.get_running_loop()  # a kernel's cell runs inside its loop
        except RuntimeError:
            return False
        self._task = loop.create_task(self._follow(), name="gpusched-widget-events")
        return True

    def stop(self) -> None:
        """Stop following."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.connected = False

    def close(self) -> None:  # noqa: D102
        self.stop()
        super().close()

    async def _follow(self) -> None:
        backoff_s = 1.0
        while True:
            try:
                events = self.client.events(after=self.last_event_id)
                self.connected = True
                self.error = ""
                async for event in events:
                    backoff_s = 1.0
                    if self.apply_event(event):
                        self._schedule_refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect after any failure
                self.error = f"events connection lost ({exc}); reconnecting"
            self.connected = False
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 30.0)

    def _schedule_refresh(self) -> None:
        """One ``GET cluster`` shortly after a burst of events, off the loop's thread."""
        if self._refresh_pending:
            return
        self._refresh_pending = True
        loop = asyncio.get_running_loop()

        async def later() -> None:
            await asyncio.sleep(0.2)
            self._refresh_pending = False
            with contextlib.suppress(Exception):
                self.apply_cluster(await loop.run_in_executor(None, self.client.cluster))

        loop.create_task(later())

    # ------------------------------------------------------------------ rendering

    @observe("nodes")
    def _render_map(self, change: Any = None) -> None:
        rows = []
        for node in self.nodes:
            cells = "".join(_gpu_cell(g) for g in node["gpus"])
            name = html.escape(node["name"])
            status = "" if node["up"] else " <span style='color:#c62828'>down</span>"
            free = sum(1 for g in node["gpus"] if g["state"] == "free")
            rows.append(
                f"<tr><td style='padding-right:8px;font-family:monospace'>{name}{status}</td>"
                f"<td><div style='display:flex;gap:3px'>{cells}</div></td>"
                f"<td style='padding-left:8px;color:#666'>{free}/{len(node['gpus'])} free</td>"
                "</tr>"
            )
        legend = " ".join(
            f"<span style='display:inline-block;width:10px;height:10px;background:{c}'></span> {s}"
            for s, c in COLOURS.items()
        )
        self._map.value = (
            f"<table>{''.join(rows)}</table><div style='font-size:smaller'>{legend} "
            "(dark fill: memory used)</div>"
            if rows
            else "<i>no nodes yet</i>"
        )

    @observe("metrics")
    def _render_figures(self, change: Any = None) -> None:
        m = self.metrics
        if not m:
            self._figures.value = ""
            return
        by_size = (
            ", ".join(
                f"{n}×{size} GPUs"
                for size, n in sorted(
                    (m.get("free_nodes_by_size") or {}).items(), key=lambda kv: int(kv[0])
                )
            )
            or "none"
        )
        self._figures.value = (
            f"<div><b>{m.get('gpus_free', '?')}/{m.get('gpus_total', '?')}</b> GPUs free · "
            f"largest placeable job <b>{m.get('largest_placeable_gpus', '?')}</b> GPUs · "
            f"fragmentation <b>{_pct(m.get('frag_ratio'))}</b> · "
            f"allocated <b>{_pct(m.get('allocated_share'))}</b> · "
            f"fully free nodes: {html.escape(by_size)}</div>"
        )

    @observe("window")
    def _render_window(self, change: Any = None) -> None:
        w = self.window
        if not w:
            self._window.value = ""
            return
        until = f" until {html.escape(str(w['until']))}" if w.get("until") else ""
        nxt = w.get("next_window")
        then = f", then <b>{html.escape(str(nxt))}</b>" if nxt and w.get("until") else ""
        rules = "; ".join(w.get("rules") or [])
        self._window.value = (
            f"<div>window <b>{html.escape(str(w.get('name')))}</b>{until}{then}"
            f"<div style='font-size:smaller;color:#666'>{html.escape(rules)}</div></div>"
        )

    @observe("queue")
    def _render_queue(self, change: Any = None) -> None:
        if not self.queue:
            self._queue.value = "<div style='color:#666'>queue empty</div>"
            return
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td style='padding:0 6px'>{html.escape(str(v))}</td>"
                for v in (
                    j["id"],
                    j["user"],
                    j["kind"],
                    j["state"],
                    j["gpus"],
                    j["node"] or "",
                    f"#{j['position']} " * bool(j["position"]) + (j["reason"] or ""),
                )
            )
            + "</tr>"
            for j in self.queue
        )
        head = "".join(
            f"<th style='padding:0 6px;text-align:left'>{h}</th>"
            for h in ("id", "user", "kind", "state", "gpus", "node", "why")
        )
        self._queue.value = f"<table><tr>{head}</tr>{rows}</table>"


def _gpu_cell(gpu: dict[str, Any]) -> str:
    fill = int(round(gpu["mem_fill"] * 100))
    return (
        f"<div title='{html.escape(gpu['title'], quote=True)}' style='position:relative;"
        f"width:22px;height:28px;background:{gpu['colour']};border:1px solid #9e9e9e;"
        f"border-radius:2px'><div style='position:absolute;bottom:0;left:0;right:0;"
        f"height:{fill}%;background:rgba(0,0,0,0.28)'></div></div>"
    )


def _pct(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) else "?"
