"""``%gpu status``: the cluster as an ipywidgets view, updated from the server's events.

:class:`ClusterMap` keeps its meaning in synced traits (``nodes``, ``metrics``, ``window``,
``queue``) computed from the API's models by :meth:`ClusterMap.apply_cluster` and
:meth:`ClusterMap.apply_event`, so the logic is tested through ``get_state()`` with no kernel.
The children are plain HTML widgets rendered from those traits: a node x GPU map coloured by
state (the lab panel's colours, exactly the legend's: memory used is a bar beside, not a shade
over the colour), each GPU numbered by its index as the panel numbers it, the jobs holding it
in its hover details, the fragmentation figures
in words, the window in force with its rules, and the queue with each waiting job's place,
expected start and reason. Every figure is written by :mod:`jupyter_gpusched.core.figures`, as
in the CLI and the lab panel.

Live updates come from the events websocket (tornado, on the kernel's running asyncio loop);
a job event that moves GPUs triggers one debounced ``GET cluster``. No polling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import Any

import ipywidgets as widgets
from traitlets import Bool, Dict, Int, List, Unicode, observe

from jupyter_gpusched.client.api import ApiError
from jupyter_gpusched.core.api import Cluster, EventMessage, Gpu, JobView, Node
from jupyter_gpusched.core.figures import (
    fragmentation_text,
    gpus_label,
    memory_label,
    percent,
    position_label,
    start_label,
    start_nudge,
    window_line,
)
from jupyter_gpusched.core.models import JobState

log = logging.getLogger(__name__)

#: GPU state -> colour; the JupyterLab panel uses the same.
COLOURS = {
    "free": "#e0e0e0",
    "interactive": "#2e7d32",
    "batch": "#1565c0",
    "foreign": "#ef6c00",
    "down": "#c62828",
}
#: The memory bar beside each GPU's colour (the lab panel's too).
MEM_BAR = "#616161"
_LIVE = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
#: Event kinds that cannot change which GPUs are taken.
_QUIET_KINDS = frozenset({"activity", "waiting", "submitted", "updated"})


def gpu_title(node: Node, gpu: Gpu) -> str:
    """Hover text of one GPU: where, state, jobs and owners, memory, utilization."""
    state = gpu.state if node.up else "down"
    lines = [f"{node.name} GPU {gpu.index} ({gpu.model})", f"state: {state}"]
    for job in gpu.jobs:
        part = f", {percent(job.share)} of the GPU" if job.share < 1 else ""
        lines.append(f"job {job.id} ({job.kind.value}) by {job.user}{part}")
    lines.append(f"memory {memory_label(gpu.mem_used_gb, gpu.mem_total_gb)}")
    lines.append(f"utilization {percent(gpu.util_pct / 100)}")
    if gpu.power_w is not None:
        lines.append(f"power {gpu.power_w:.0f} W")
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
        "gpus": gpus_label(spec.gpus, spec.gpu_share, spec.gpu_mem_gb),
        # `a100-0: 0,1`, as the lab panel's rows write it: GPUs are named by index everywhere.
        "node": _where(job),
        "position": job.position,
        "estimated_start": (
            job.estimated_start.isoformat() if job.estimated_start is not None else None
        ),
        "reason": job.reason,
        "name": spec.name or " ".join(spec.command or []) or "",
    }


def _where(job: JobView) -> str | None:
    p = job.placement
    if p is None:
        return None
    return f"{p.node}: {','.join(str(i) for i in p.gpu_indices)}" if p.gpu_indices else p.node


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

    def __init__(
        self,
        client: Any = None,
        *,
        now: Callable[[], datetime] | None = None,
        tz: tzinfo | None = None,
        **kwargs: Any,
    ) -> None:
        # The clock and zone times are written in (the kernel's local zone by default).
        self.now = now or (lambda: datetime.now(UTC))
        self.tz = tz or _local_tz()
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
                if isinstance(exc, ApiError) and exc.status == 429:  # over the user's streams
                    self.error = f"live updates refused: {exc.message}"
                    backoff_s = max(backoff_s, exc.retry_after_s or 0.0)
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
            f"<table>{''.join(rows)}</table><div style='font-size:smaller'>{legend} · "
            "numbers: GPU index (as in the lab panel) · hover: the jobs holding it · "
            "grey bar: memory used</div>"
            if rows
            else "<i>no nodes yet</i>"
        )

    @observe("metrics")
    def _render_figures(self, change: Any = None) -> None:
        m = self.metrics
        if not m:
            self._figures.value = ""
            return
        self._figures.value = (
            f"<div><b>{m.get('gpus_free', '?')}/{m.get('gpus_total', '?')}</b> GPUs free · "
            f"{html.escape(fragmentation_text(m))}</div>"
        )

    @observe("window")
    def _render_window(self, change: Any = None) -> None:
        w = self.window
        if not w:
            self._window.value = ""
            return
        line = html.escape(window_line(w, self.now(), self.tz))
        rules = "".join(f"<li>{html.escape(r)}</li>" for r in w.get("rules") or [])
        self._window.value = (
            f"<div><b>{line}</b> ({html.escape(str(w.get('applies', '')))})"
            f"<ul style='margin:0;font-size:smaller;color:#666'>{rules}</ul></div>"
        )

    @observe("queue")
    def _render_queue(self, change: Any = None) -> None:
        if not self.queue:
            self._queue.value = "<div style='color:#666'>queue empty</div>"
            return
        now, tz = self.now(), self.tz
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td style='padding:0 6px'>{html.escape(str(v))}</td>"
                for v in (j["id"], j["user"], j["kind"], j["state"], j["gpus"], j["node"] or "")
            )
            + f"<td style='padding:0 6px'>{html.escape(_why(j, now, tz))}</td></tr>"
            for j in self.queue
        )
        head = "".join(
            f"<th style='padding:0 6px;text-align:left'>{h}</th>"
            for h in ("job", "user", "kind", "state", "gpus", "node", "why and when")
        )
        self._queue.value = f"<table><tr>{head}</tr>{rows}</table>"


def _why(job: dict[str, Any], now: datetime, tz: tzinfo) -> str:
    """``2nd in line, starts in 12m (14:05): needs 8 GPUs ...`` for a waiting job."""
    if job["state"] != "queued":
        return ""
    at = job.get("estimated_start")
    parts = [position_label(job["position"])] if job.get("position") else []
    fallback = datetime.fromisoformat(at) if at else None
    parts.append(f"starts {start_label(job.get('estimate'), fallback, now, tz)}")
    reason = (job.get("reason") or "").removeprefix("waiting: ")
    nudge = start_nudge(job.get("estimate"))
    text = f"{', '.join(parts)}: {reason}" if reason else ", ".join(parts)
    return f"{text} ({nudge})" if nudge else text


def _local_tz() -> tzinfo:
    return datetime.now().astimezone().tzinfo or UTC


def _gpu_cell(gpu: dict[str, Any]) -> str:
    """One GPU: its state's colour (as in the legend), its index, a memory bar.

    The index, not the jobs holding it, as the lab panel numbers its cells: "GPU 2" means one
    GPU wherever it is read. The jobs are in the hover text.
    """
    fill = int(round(gpu["mem_fill"] * 100))
    jobs = ",".join(str(j) for j in gpu["jobs"])
    text = "#3e3e3e" if gpu["state"] == "free" else "#fff"
    return (
        f"<div title='{html.escape(gpu['title'], quote=True)}' style='display:flex;"
        f"width:30px;height:28px;border:1px solid #9e9e9e;border-radius:2px;overflow:hidden'>"
        f"<div style='flex:1;background:{gpu['colour']};color:{text};font-size:9px;"
        f"line-height:28px;text-align:center;overflow:hidden' data-jobs='{jobs}'>"
        f"{gpu['index']}</div>"
        f"<div style='width:5px;background:#f5f5f5;position:relative'><div style='position:"
        f"absolute;bottom:0;left:0;right:0;height:{fill}%;background:{MEM_BAR}'></div></div>"
        "</div>"
    )
