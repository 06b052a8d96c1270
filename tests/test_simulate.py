"""Trace replay: the FGD protocol on the openb trace and the ``simulate`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpusched.cli.app import main as cli_main
from jupyter_gpusched.packing.packer import NodeShape, PackRequest
from jupyter_gpusched.packing.simulate import (
    inflate,
    load_nodes,
    load_tasks,
    replay,
    scale_cpu_only,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"
needs_data = pytest.mark.skipif(
    not (DATA / "openb_node_list_gpu_node.csv").is_file(),
    reason=f"openb trace not found at {DATA} (Alibaba clusterdata, cluster-trace-gpu-v2023)",
)


def test_inflate_shuffles_then_samples_up_to_130_percent() -> None:
    tasks = [PackRequest(1), PackRequest(1, 0.5), PackRequest(0, cpus=2)]
    arrivals = inflate(tasks, capacity_gpus=10, seed=1)
    demand = sum(t.gpus * t.gpu_share for t in arrivals)
    assert 13 - 1 < demand <= 13
    assert sorted(map(repr, arrivals[:3])) == sorted(map(repr, tasks))
    assert inflate(tasks, 10, seed=1) == arrivals


def test_replay_records_arrived_and_allocated_after_each_task() -> None:
    nodes = [NodeShape("n0", "T4", 16, 2, 16, 64), NodeShape("n1", "T4", 16, 2, 16, 64)]
    result = replay(nodes, [PackRequest(1, cpus=4)], policy="best_fit", seed=0)
    assert result.placements == 5  # 5 one-GPU tasks = 1.25 x 4 GPUs
    assert result.failed == 1
    assert result.arrived_pct.tolist() == [25.0, 50.0, 75.0, 100.0, 125.0]
    assert result.alloc_pct.tolist() == [25.0, 50.0, 75.0, 100.0, 100.0]
    assert result.alloc_at(100) == 100.0


def test_missing_trace_is_one_clear_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["simulate", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "cluster-trace-gpu-v2023" in err and str(tmp_path) in err


def test_unknown_policy_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["simulate", "--policy", "magic"]) == 2
    assert "magic" in capsys.readouterr().err


@needs_data
def test_openb_loads_as_published() -> None:
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(DATA / "openb_pod_list_default.csv")
    assert (len(nodes), sum(n.gpus for n in nodes), len(tasks)) == (1213, 6212, 8152)
    assert sum(t.gpus == 8 for t in tasks) == 44
    spec = load_tasks(DATA / "openb_pod_list_gpuspec20.csv")
    assert any(t.models == ("V100M16", "V100M32") for t in spec)


def _subset_cluster() -> tuple[list[NodeShape], list[PackRequest]]:
    """Every 4th openb node (303 nodes) with the default tasks: a CI-sized replay."""
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")[::4]
    return nodes, load_tasks(DATA / "openb_pod_list_default.csv")


@pytest.mark.slow  # replays a quarter of the trace
@needs_data
def test_fragmentation_beats_best_fit_on_a_quarter_of_openb() -> None:
    nodes, tasks = _subset_cluster()
    ours = 100 - replay(nodes, tasks, "fragmentation", seed=0).alloc_at(100)
    ours_random = 100 - replay(nodes, tasks, "fragmentation", seed=0, tie_break="random").alloc_at(
        100
    )
    best_fit = 100 - replay(nodes, tasks, "best_fit", seed=0).alloc_at(100)
    assert ours <= UNALLOC_SUBSET_MAX
    assert ours_random <= UNALLOC_SUBSET_MAX
    assert ours < best_fit - 1.0


#: measured on the subset, seed 0: 3.84 % (order ties), 3.84 % (random ties) (best_fit:
#: 7.38 %), plus a margin of about 0.5 point; a regression of the policy trips it
UNALLOC_SUBSET_MAX = 4.4


def test_cpu_heavy_variant_scales_the_cpus_of_cpu_only_tasks_alone() -> None:
    tasks = [PackRequest(0, cpus=12.5, mem_gb=56), PackRequest(1, 0.5, cpus=6, mem_gb=12)]
    assert scale_cpu_only(tasks, 2.5) == [PackRequest(0, cpus=31.25, mem_gb=56), tasks[1]]


@needs_data
def test_fragmentation_keeps_the_lead_when_cpu_only_tasks_ask_2_5x_the_cpus() -> None:
    # CPU-only tasks asking 2.5x their CPUs make CPU the scarce dimension: a policy that
    # sees GPUs alone strands them behind exhausted CPUs (bench/cpu_heavy.py, whole cluster)
    nodes, tasks = _subset_cluster()
    heavy = scale_cpu_only(tasks, 2.5)

    def unalloc(policy: str, tie_break: str) -> float:
        return 100 - replay(nodes, heavy, policy, seed=0, tie_break=tie_break).alloc_at(100)

    ours = max(unalloc("fragmentation", tie) for tie in ("order", "random"))
    best_fit = min(unalloc("best_fit", tie) for tie in ("order", "random"))
    assert ours <= UNALLOC_CPU_HEAVY_MAX
    assert ours < best_fit - 1.0
    assert ours < unalloc("fgd", "order") - 1.0


#: measured on the subset at 2.5x, seed 0: 14.23 % (order ties), 13.72 % (random ties)
#: (best_fit: 17.22 / 17.47 %, fgd 18.20 % order), plus a margin of about 0.8 point
UNALLOC_CPU_HEAVY_MAX = 15.0


@pytest.mark.slow  # replays the trace
@needs_data
def test_simulate_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        [
            "simulate",
            "--data-dir",
            str(DATA),
            "--policy",
            "first_fit",
            "--tie-break",
            "random",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    alloc = out["results"]["first_fit"]["alloc_pct"]
    assert set(alloc) == {"50", "80", "90", "95", "100", "130"}
    assert 80 < alloc["100"] < 95
