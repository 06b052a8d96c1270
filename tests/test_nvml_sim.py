"""The simulated NVML answers like pynvml, from a state file plus the node's live processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pynvml
import pytest
from _fixtures_polling import wait_for

from jupyter_gpusched.cluster.sim import nvml as nvml_sim

MIB = 1024 * 1024

# Four A100s in NVLink pairs (0-1, 2-3) plus a fifth without a partner; written by hand so the
# test pins the file format sim.py writes.
STATE = {
    "version": 1,
    "node": "n0",
    "cpus": 64,
    "mem_gb": 512,
    "gpus": [
        {
            "index": i,
            "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            "name": "NVIDIA A100-SXM4-80GB",
            "mem_total_mb": 81920,
            "pci_bus_id": f"00000000:{0x10 + i:02X}:00.0",
            "nvlink_links": 12,
            "nvlink_peer": peer,
            "power_idle_mw": 55000,
            "power_max_mw": 400000,
        }
        for i, peer in enumerate([1, 0, 3, 2, None])
    ],
    "foreign": [],
}


@pytest.fixture
def state_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(STATE))
    monkeypatch.setenv(nvml_sim.STATE_ENV, str(path))
    return path


@pytest.fixture
def nv(state_path: Path) -> Iterator[ModuleType]:
    nvml_sim.nvmlInit()
    yield nvml_sim
    nvml_sim.nvmlShutdown()


@pytest.fixture
def spawn(state_path: Path) -> Iterator:
    """Start real processes 'on the node' (its marker in their env); kill them afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], *, state: Path | None = None, **env: str) -> subprocess.Popen[bytes]:
        full = {"PATH": os.environ["PATH"], nvml_sim.STATE_ENV: str(state or state_path), **env}
        proc = subprocess.Popen(argv, env=full, start_new_session=True)
        procs.append(proc)
        # Popen returns once exec passed its point of no return; the new environment shows in
        # /proc a moment later, and the simulator finds processes by it.
        marker = f"{nvml_sim.STATE_ENV}=".encode()
        wait_for(
            lambda: marker in Path(f"/proc/{proc.pid}/environ").read_bytes(),
            interval_s=0.005,
            what=f"{argv} to start",
        )
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: children too
        proc.wait()


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def refresh() -> None:
    """New NVML session: answers reflect processes started or ended since the last one."""
    nvml_sim.nvmlShutdown()
    nvml_sim.nvmlInit()


def processes(nv: ModuleType) -> dict[int, list[tuple[int, float]]]:
    """GPU index -> [(pid, used MiB)]."""
    return {
        i: [
            (p.pid, p.usedGpuMemory / MIB)
            for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))
        ]
        for i in range(nv.nvmlDeviceGetCount())
    }


def test_static_gpu_facts_come_from_the_state_file(nv: ModuleType) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(2)
    mem = nv.nvmlDeviceGetMemoryInfo(h)

    assert nv.nvmlDeviceGetCount() == 5
    assert nv.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    assert nv.nvmlDeviceGetUUID(h) == "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"
    assert nv.nvmlDeviceGetPciInfo(h).busId == "00000000:12:00.0"
    assert (mem.total, mem.used, mem.free) == (81920 * MIB, 0, 81920 * MIB)
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert nv.nvmlDeviceGetPowerUsage(h) == 55000
    assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(h))) == 2
    assert nv.host_resources() == {"cpus": 64.0, "mem_gb": 512.0}


def test_nvlink_links_lead_to_the_pair_partner(nv: ModuleType) -> None:
    bus_to_index = {g["pci_bus_id"]: g["index"] for g in STATE["gpus"]}
    peers = {}
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        found = set()
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link):
                    found.add(bus_to_index[nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId])
            except nv.NVMLError_NotSupported:
                continue
        peers[i] = found

    assert peers == {0: {1}, 1: {0}, 2: {3}, 3: {2}, 4: set()}


def test_nvlink_errors_are_the_real_nvml_error_classes(nv: ModuleType) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    lonely = nv.nvmlDeviceGetHandleByIndex(4)

    assert nv.nvmlDeviceGetNvLinkState(lonely, 0) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkRemotePciInfo(lonely, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a link this GPU does not have
        nv.nvmlDeviceGetNvLinkState(h, 12)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # beyond any GPU's links
        nv.nvmlDeviceGetNvLinkState(h, pynvml.NVML_NVLINK_MAX_LINKS)


@pytest.mark.parametrize("index", [5, -1, 99])
def test_bad_gpu_index_raises_invalid_argument(nv: ModuleType, index: int) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument) as err:
        nv.nvmlDeviceGetHandleByIndex(index)
    assert isinstance(err.value, pynvml.NVMLError)
    assert err.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_unknown_uuid_raises_not_found(nv: ModuleType) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_queries_before_init_raise_uninitialized(state_path: Path) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml_sim.nvmlDeviceGetCount()


def test_no_state_file_fails_init_like_a_node_without_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(nvml_sim.STATE_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        nvml_sim.nvmlInit()
    monkeypatch.delenv(nvml_sim.STATE_ENV)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        nvml_sim.nvmlInit()


def test_live_process_uses_the_memory_it_declared_on_its_visible_gpus(
    nv: ModuleType, spawn
) -> None:
    uuid3 = STATE["gpus"][3]["uuid"]
    job = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES=f"1,{uuid3}", GPUSCHED_GPU_MEM_MB="20000")
    refresh()

    mem1 = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(1))
    assert processes(nv) == {0: [], 1: [(job.pid, 20000.0)], 2: [], 3: [(job.pid, 20000.0)], 4: []}
    assert (mem1.used, mem1.free) == (20000 * MIB, (81920 - 20000) * MIB)
    assert nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(1)).gpu > 0
    assert nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetHandleByIndex(1)) > 55000
    assert nv.nvmlSystemGetProcessName(job.pid) == "sleep"

    job.kill()
    job.wait()
    refresh()
    assert processes(nv)[1] == []
    assert nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(1)).used == 0


def test_zombie_process_is_not_counted(nv: ModuleType, spawn) -> None:
    job = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES="0", GPUSCHED_GPU_MEM_MB="1000")
    os.kill(job.pid, signal.SIGKILL)
    wait_for(
        lambda: Path(f"/proc/{job.pid}/stat").read_text().split(") ")[1][0] == "Z",
        interval_s=0.01,
        what="the killed child to become a zombie",
    )
    refresh()

    assert processes(nv)[0] == []


def test_process_without_declaration_uses_a_cuda_context(nv: ModuleType, spawn) -> None:
    job = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES="2")
    refresh()

    assert processes(nv)[2] == [(job.pid, nvml_sim.DEFAULT_PROCESS_MEM_MB)]


def test_child_that_inherits_the_declaration_is_counted_once(nv: ModuleType, spawn) -> None:
    # dash keeps the shell as parent of sleep here (not the last command), both carry the env
    shell = spawn(
        ["/bin/sh", "-c", "sleep 60; true"], CUDA_VISIBLE_DEVICES="0", GPUSCHED_GPU_MEM_MB="3000"
    )
    wait_for(lambda: children_of(shell.pid), interval_s=0.01, what="the shell's child")
    refresh()

    assert processes(nv)[0] == [(shell.pid, 3000.0)]


def test_processes_of_other_nodes_and_without_gpus_are_ignored(
    nv: ModuleType, spawn, state_path: Path
) -> None:
    other = state_path.with_name("gpus.json.other")  # the marker is a prefix of this path
    spawn(["sleep", "60"], state=other, CUDA_VISIBLE_DEVICES="0", GPUSCHED_GPU_MEM_MB="100")
    spawn(["sleep", "60"], GPUSCHED_GPU_MEM_MB="100")  # no CUDA_VISIBLE_DEVICES: CPU only
    refresh()

    assert all(procs == [] for procs in processes(nv).values())


@pytest.mark.parametrize(
    ("visible", "gpus"),
    [
        ("3,0", [3, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first entry naming no GPU
        ("GPU-00000004", [4]),  # a unique UUID prefix
        ("GPU-0000000", []),  # an ambiguous prefix names nothing
        ("", []),
        ("-1", []),
    ],
)
def test_cuda_visible_devices_is_read_like_cuda(
    nv: ModuleType, spawn, visible: str, gpus: list[int]
) -> None:
    job = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES=visible, GPUSCHED_GPU_MEM_MB="10")
    refresh()

    assert sorted(i for i, procs in processes(nv).items() if (job.pid, 10.0) in procs) == sorted(
        gpus
    )


def test_foreign_processes_in_the_state_file_are_listed(nv: ModuleType, state_path: Path) -> None:
    state = {**STATE, "foreign": [{"gpu_index": 4, "pid": 4100000, "mem_mb": 5000, "name": "x"}]}
    state_path.write_text(json.dumps(state))
    refresh()

    assert processes(nv)[4] == [(4100000, 5000.0)]
    assert nv.nvmlSystemGetProcessName(4100000) == "x"
    assert nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(4)).used == 5000 * MIB


def test_node_pids_lists_every_live_process_of_the_node(spawn, state_path: Path) -> None:
    cpu_job = spawn(["sleep", "60"])
    gpu_job = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES="0")
    spawn(["sleep", "60"], state=state_path.with_name("elsewhere.json"))

    assert nvml_sim.node_pids(str(state_path)) == sorted([cpu_job.pid, gpu_job.pid])
