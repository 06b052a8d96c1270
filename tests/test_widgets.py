"""The cluster map widget: state from cluster JSON and events, and live updates from a server."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.client.widgets import COLOURS, ClusterMap
from jupyter_gpusched.core.api import Cluster, EventMessage, JobView

pytest.register_assert_rewrite("_fixtures_server", "_fixtures_live_server")
from _fixtures_live_server import api  # noqa: E402
from _fixtures_polling import wait_for_async  # noqa: E402

AT = datetime(2026, 11, 23, 10, tzinfo=UTC)
CLUSTER_JSON: dict[str, Any] = {
    "nodes": [
        {
            "name": "g0",
            "up": True,
            "error": None,
            "cpus": 32,
            "mem_gb": 256,
            "gpus": [
                {
                    "index": 0,
                    "model": "A100-80GB",
                    "uuid": "GPU-a",
                    "nvlink_peers": [],
                    "state": "interactive",
                    "mem_total_gb": 80.0,
                    "mem_used_gb": 20.0,
                    "util_pct": 55.0,
                    "share_used": 1.0,
                    "jobs": [
                        {
                            "id": 4,
                            "user": "alice",
                            "kind": "lease",
                            "priority_class": "interactive",
                            "share": 1.0,
                        }
                    ],
                },
                {
                    "index": 1,
                    "model": "A100-80GB",
                    "uuid": "GPU-a",
                    "nvlink_peers": [],
                    "state": "batch",
                    "mem_total_gb": 80.0,
                    "mem_used_gb": 40.0,
                    "util_pct": 90.0,
                    "share_used": 0.5,
                    "jobs": [
                        {
                            "id": 5,
                            "user": "bob",
                            "kind": "script",
                            "priority_class": "batch",
                            "share": 0.5,
                        }
                    ],
                },
                {
                    "index": 2,
                    "model": "A100-80GB",
                    "uuid": "GPU-a",
                    "nvlink_peers": [],
                    "state": "free",
                    "mem_total_gb": 80.0,
                    "mem_used_gb": 0.0,
                    "util_pct": 0.0,
                    "share_used": 0.0,
                    "jobs": [],
                },
                {
                    "index": 3,
                    "model": "A100-80GB",
                    "uuid": "GPU-a",
                    "nvlink_peers": [],
                    "state": "foreign",
                    "mem_total_gb": 80.0,
                    "mem_used_gb": 8.0,
                    "util_pct": 10.0,
                    "share_used": 0.0,
                    "jobs": [],
                },
            ],
        },
        {
            "name": "g1",
            "up": False,
            "error": "connection refused",
            "cpus": 8,
            "mem_gb": 64,
            "gpus": [
                {
                    "index": 0,
                    "model": "T4",
                    "uuid": "GPU-t",
                    "nvlink_peers": [],
                    "state": "down",
                    "mem_total_gb": 16.0,
                    "mem_used_gb": 0.0,
                    "util_pct": 0.0,
                    "share_used": 0.0,
                    "jobs": [],
                },
            ],
        },
    ],
    "metrics": {
        "allocated_share": 0.3,
        "unallocated_share": 0.7,
        "free_nodes_by_size": {"8": 1},
        "largest_placeable_gpus": 1,
        "frag_ratio": 0.25,
        "gpus_total": 5,
        "gpus_free": 1,
    },
    "window": {
        "name": "day",
        "applies": "Mon-Fri 08:00-20:00",
        "since": "2026-11-23T08:00:00+00:00",
        "until": "2026-11-23T20:00:00+00:00",
        "next_window": "night",
        "interactive_reserved_share": 0.25,
        "interactive_max_share": 0.75,
        "batch_max_runtime_s": 14400,
        "lease_idle_timeout_s": 1800,
        "preempt_batch": True,
        "migrate_batch": False,
        "interactive_first": True,
        "rules": ["interactive leases: 25% of GPUs reserved, at most 75% of GPUs"],
    },
    "queue": {"queued": 0, "running": 2},
    "at": "2026-11-23T10:00:00+00:00",
}
CLUSTER = Cluster.model_validate(CLUSTER_JSON)


def _job(job_id: int, state: str, position: int | None = None, **more: Any) -> JobView:
    return JobView.model_validate(
        {
            **more,
            "id": job_id,
            "state": state,
            "user": "alice",
            "position": position,
            "priority_class": "batch",
            "submitted_at": "2026-11-23T10:00:00+00:00",
            "reason": "waiting: no room" if state == "queued" else None,
            "spec": {"kind": "script", "gpus": 1, "command": ["python", "x.py"], "user": "alice"},
        }
    )


def _event(event_id: int, kind: str, **fields: Any) -> EventMessage:
    return EventMessage(id=event_id, at=AT, kind=kind, job_id=None, **fields)


def test_cluster_json_becomes_gpu_cells_coloured_by_state_with_memory_fill() -> None:
    w = ClusterMap()
    w.apply_cluster(CLUSTER)
    state = w.get_state()
    g0, g1 = state["nodes"]
    assert [g["colour"] for g in g0["gpus"]] == ["#2e7d32", "#1565c0", "#e0e0e0", "#ef6c00"]
    assert [g["mem_fill"] for g in g0["gpus"]] == [0.25, 0.5, 0.0, 0.1]
    assert g0["gpus"][0]["jobs"] == [4]
    assert g0["gpus"][1]["title"].splitlines() == [
        "g0 GPU 1 (A100-80GB)",
        "state: batch",
        "job 5 (script) by bob, 50% of the GPU",
        "memory 40G / 80G",
        "utilization 90%",
    ]
    assert (g1["up"], g1["gpus"][0]["colour"]) == (False, COLOURS["down"])
    assert "node down: connection refused" in g1["gpus"][0]["title"]
    assert state["metrics"]["largest_placeable_gpus"] == 1
    assert state["window"]["next_window"] == "night"


def test_the_rendered_view_shows_figures_window_and_hover_details() -> None:
    w = ClusterMap(now=lambda: AT, tz=UTC)
    w.apply_cluster(CLUSTER)
    w.apply_jobs([_job(2, "queued", 2, estimated_start=AT + timedelta(minutes=12))])
    views = {c.model_id: c.value for c in w.children}
    text = "".join(views.values())
    assert "title='g0 GPU 0 (A100-80GB)\nstate: interactive\njob 4 (lease) by alice" in text
    assert (
        "largest job that fits now: 1 GPU; 0 GPUs stranded in partly used GPUs; 25% of the free "
        "capacity fits no usual job size (lower is better)"
    ) in text
    assert "<b>day window until 20:00, then night</b> (Mon-Fri 08:00-20:00)" in text
    assert "<li>interactive leases: 25% of GPUs reserved, at most 75% of GPUs</li>" in text
    # the cell is the legend's colour, with its GPU index written on it
    assert "background:#2e7d32;color:#fff;font-size:9px;line-height:28px;text-align:center;" in text
    assert "<td style='padding:0 6px'>2nd in line, starts in 12m (10:12): no room</td>" in text
    assert "<td style='padding:0 6px'>1 GPU</td>" in text


def test_gpus_are_numbered_by_index_as_in_the_lab_panel() -> None:
    # The lab panel writes "0".."3" on g0's cells and "a100-0: 0,1" in a job's row; the widget
    # wrote the holding job's id (4, 5) on the cells, so "GPU 4" meant two things.
    w = ClusterMap(now=lambda: AT, tz=UTC)
    w.apply_cluster(CLUSTER)
    placement = {"node": "g0", "gpu_indices": [0, 1], "share_per_gpu": 1.0}
    w.apply_jobs([_job(4, "running", placement=placement)])
    cells = re.findall(r"data-jobs='([\d,]*)'>(\d+)</div>", w.children[0].value)
    assert cells == [("4", "0"), ("5", "1"), ("", "2"), ("", "3"), ("", "0")]
    assert "numbers: GPU index (as in the lab panel)" in w.children[0].value
    assert w.get_state()["queue"][0]["node"] == "g0: 0,1"
    assert "<td style='padding:0 6px'>g0: 0,1</td>" in w.children[3].value


def test_job_events_keep_the_queue_in_order_and_say_when_the_map_changed() -> None:
    w = ClusterMap()
    w.apply_jobs([_job(1, "running"), _job(2, "queued", 2), _job(3, "succeeded")])
    assert [j["id"] for j in w.get_state()["queue"]] == [2, 1]
    assert w.apply_event(_event(10, "submitted", job=_job(4, "queued", 1))) is False
    assert [(j["id"], j["position"]) for j in w.get_state()["queue"]] == [(4, 1), (2, 2), (1, None)]
    assert w.apply_event(_event(11, "state", job=_job(1, "succeeded"))) is True
    assert [j["id"] for j in w.get_state()["queue"]] == [4, 2]
    assert w.get_state()["last_event_id"] == 11


def test_a_cluster_event_replaces_the_map_at_once() -> None:
    w = ClusterMap()
    assert w.apply_event(_event(3, "cluster", cluster=CLUSTER)) is False
    assert len(w.get_state()["nodes"]) == 2 and w.get_state()["last_event_id"] == 3


@pytest.mark.asyncio
async def test_the_live_map_follows_a_job_starting_and_ending(live_server: Any) -> None:
    client = GpuSchedClient(live_server.url, live_server.token)
    w = ClusterMap(client=client)
    w.refresh()
    assert w.get_state()["nodes"] and w.error == ""
    assert w.follow() is True
    job = api(
        live_server,
        "POST",
        "jobs",
        {
            "kind": "script",
            "gpus": 2,
            "name": "widget-watch",
            "command": [sys.executable, "-c", "import time; time.sleep(60)"],
        },
    )

    async def until(check: Any) -> None:
        await wait_for_async(w.get_state, check, what="the widget's state")

    def gpus_of_job(state: dict[str, Any]) -> list[str]:
        return [g["state"] for n in state["nodes"] for g in n["gpus"] if job["id"] in g["jobs"]]

    try:
        await until(lambda s: gpus_of_job(s) == ["batch", "batch"])
        await until(
            lambda s: any(j["id"] == job["id"] and j["state"] == "running" for j in s["queue"])
        )
        assert w.connected
        api(live_server, "DELETE", f"jobs/{job['id']}")
        await until(
            lambda s: gpus_of_job(s) == [] and all(j["id"] != job["id"] for j in s["queue"])
        )
    finally:
        w.close()
