"""A simulated NVML: the pynvml subset the node agent uses, answered from a JSON state file.

The agent imports this module instead of :mod:`pynvml` when env ``GPUSCHED_NVML_MODULE`` names
it; env ``GPUSCHED_SIM_STATE`` names the node's state file (``gpus.json``, written by
:mod:`jupyter_gpusched.cluster.sim.cluster`). Errors are the real :class:`pynvml.NVMLError`
subclasses, so the agent's error handling is exercised exactly as on a real GPU node.

Where memory use comes from
---------------------------
The state file holds the static GPUs and the "foreign" processes a test injected. Jobs are found
by scanning ``/proc/*/environ`` of live processes for this node's marker: a process counts as a
compute process when its environment has ``GPUSCHED_SIM_STATE`` equal to this node's state file
and ``CUDA_VISIBLE_DEVICES`` set; it uses ``GPUSCHED_GPU_MEM_MB`` MiB on each of its visible GPUs
(:data:`DEFAULT_PROCESS_MEM_MB`, a bare CUDA context, when it did not declare any). Scanning needs
no bookkeeping that could go stale: detached jobs started by the agent's wrapper inherit the
environment, a job that dies disappears by itself (zombies count as dead, since PID 1 may not reap
orphans), and a restarted simulator sharing the base directory finds its old jobs again. A child
that inherited the same GPUs and declaration from its parent is not counted twice: each process
tree is reported once, under its topmost pid (the job's process-group leader).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pynvml import (
    NVML_FEATURE_DISABLED,
    NVML_FEATURE_ENABLED,
    NVML_NVLINK_MAX_LINKS,
    NVML_TEMPERATURE_GPU,
    NVMLError,
    NVMLError_InvalidArgument,
    NVMLError_LibraryNotFound,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_Uninitialized,
)

__all__ = [
    "DEFAULT_PROCESS_MEM_MB",
    "MEM_ENV",
    "NVML_FEATURE_DISABLED",
    "NVML_FEATURE_ENABLED",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_TEMPERATURE_GPU",
    "NVMLError",
    "NVMLError_InvalidArgument",
    "NVMLError_LibraryNotFound",
    "NVMLError_NotFound",
    "NVMLError_NotSupported",
    "NVMLError_Uninitialized",
    "STATE_ENV",
    "host_resources",
    "node_pids",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetProcessName",
]

STATE_ENV = "GPUSCHED_SIM_STATE"
"""Env var naming the node's state file; also the marker that ties a process to a sim node."""

MEM_ENV = "GPUSCHED_GPU_MEM_MB"
"""Env var a job sets to declare the GPU memory (MiB) it uses on each visible GPU."""

DEFAULT_PROCESS_MEM_MB = 512.0
"""Memory of a GPU process that declared none: about what a bare CUDA context takes."""

_SNAPSHOT_TTL_S = 0.2  # one probe asks ~10 questions per GPU; scan /proc once for all of them
_MIB = 1024 * 1024


@dataclass(frozen=True)
class _Device:
    """Handle returned by :func:`nvmlDeviceGetHandleByIndex`."""

    index: int


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int
    free: int
    reserved: int = 0


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _ProcessInfo:
    pid: int
    usedGpuMemory: int  # pynvml's field name
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class _PciInfo:
    busId: str  # pynvml's field name
    domain: int
    bus: int
    device: int

    @property
    def busIdLegacy(self) -> str:  # pynvml's field name
        """Short form ``0000:07:00.0`` older tools print."""
        return self.busId[4:]


@dataclass(frozen=True)
class _Snapshot:
    state: dict[str, Any]
    procs: dict[int, list[_ProcessInfo]]  # gpu index -> compute processes
    names: dict[int, str]  # pid -> process name


_initialized = 0
_cache: _Snapshot | None = None
_cache_at = 0.0


def _state_path() -> str:
    path = os.environ.get(STATE_ENV)
    if not path:
        # No state file: this is no simulated node; fail as a machine without a driver does.
        raise NVMLError_LibraryNotFound()
    return path


def _load_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            state: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        raise NVMLError_LibraryNotFound() from None
    return state


def _snapshot() -> _Snapshot:
    global _cache, _cache_at
    if not _initialized:
        raise NVMLError_Uninitialized()
    now = time.monotonic()
    if _cache is None or now - _cache_at > _SNAPSHOT_TTL_S:
        path = _state_path()
        state = _load_state(path)
        procs, names = _scan(path, state)
        _cache, _cache_at = _Snapshot(state, procs, names), now
    return _cache


def _visible_gpus(value: str, gpus: list[dict[str, Any]]) -> list[int]:
    """GPU indices named by ``CUDA_VISIBLE_DEVICES`` (indices, UUIDs or unique UUID prefixes).

    Like CUDA, parsing stops at the first entry that names no GPU.
    """
    found: list[int] = []
    for token in (t.strip() for t in value.split(",")):
        index: int | None = None
        if token.isdigit():
            index = int(token) if int(token) < len(gpus) else None
        elif token.startswith("GPU-"):
            hits = [g["index"] for g in gpus if str(g["uuid"]).startswith(token)]
            index = hits[0] if len(hits) == 1 else None
        if index is None:
            break
        if index not in found:
            found.append(index)
    return found


def _proc_stat(pid: str) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields follow the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def _node_processes(path: str) -> Iterator[tuple[int, int, dict[bytes, bytes]]]:
    """(pid, parent pid, environment) of every live process whose marker names ``path``."""
    marker = f"{STATE_ENV}={path}".encode()
    for pid_s in os.listdir("/proc"):
        if not pid_s.isdigit():
            continue
        try:
            with open(f"/proc/{pid_s}/environ", "rb") as f:
                raw = f.read()
        except OSError:  # gone, or another user's process
            continue
        if marker not in raw:
            continue
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        if env.get(STATE_ENV.encode()) != path.encode():
            continue  # the marker was a prefix of a longer path
        stat = _proc_stat(pid_s)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        yield int(pid_s), stat[1], env


def node_pids(state_path: str) -> list[int]:
    """Pids of the live processes a simulated node runs (what a node crash would kill)."""
    return sorted(pid for pid, _, _ in _node_processes(state_path) if pid != os.getpid())


def _scan(path: str, state: dict[str, Any]) -> tuple[dict[int, list[_ProcessInfo]], dict[int, str]]:
    """Find live processes of this node that use GPUs, plus the foreign ones in the state."""
    gpus: list[dict[str, Any]] = state.get("gpus", [])
    found: dict[int, tuple[int, tuple[str, str], list[int], float]] = {}
    for pid, ppid, env in _node_processes(path):
        if b"CUDA_VISIBLE_DEVICES" not in env:
            continue
        cvd = env[b"CUDA_VISIBLE_DEVICES"].decode(errors="replace")
        mem_raw = env.get(MEM_ENV.encode(), b"").decode(errors="replace")
        try:
            mem_mb = float(mem_raw) if mem_raw else DEFAULT_PROCESS_MEM_MB
        except ValueError:
            mem_mb = DEFAULT_PROCESS_MEM_MB
        found[pid] = (ppid, (cvd, mem_raw), _visible_gpus(cvd, gpus), max(mem_mb, 0.0))

    procs: dict[int, list[_ProcessInfo]] = {int(g["index"]): [] for g in gpus}
    names: dict[int, str] = {}
    for pid, (ppid, key, indices, mem_mb) in sorted(found.items()):
        parent = found.get(ppid)
        if parent is not None and parent[1] == key:
            continue  # same job: counted under its topmost process
        for i in indices:
            procs[i].append(_ProcessInfo(pid, int(mem_mb * _MIB)))
    for entry in state.get("foreign", []):
        i = int(entry["gpu_index"])
        if i in procs:
            procs[i].append(_ProcessInfo(int(entry["pid"]), int(float(entry["mem_mb"]) * _MIB)))
            names[int(entry["pid"])] = str(entry.get("name", "python"))
    return procs, names


def _gpu(handle: object) -> dict[str, Any]:
    if not isinstance(handle, _Device):
        raise NVMLError_InvalidArgument()
    gpus = _snapshot().state.get("gpus", [])
    if not 0 <= handle.index < len(gpus):
        raise NVMLError_InvalidArgument()
    gpu: dict[str, Any] = gpus[handle.index]
    return gpu


def _used_bytes(gpu: dict[str, Any]) -> tuple[int, int]:
    total = int(float(gpu["mem_total_mb"]) * _MIB)
    used = sum(p.usedGpuMemory for p in _snapshot().procs.get(int(gpu["index"]), []))
    return total, min(used, total)


def _link(handle: object, link: int) -> dict[str, Any]:
    gpu = _gpu(handle)
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError_InvalidArgument()
    if link >= int(gpu.get("nvlink_links", 0)):
        raise NVMLError_NotSupported()
    return gpu


# ---- pynvml API -------------------------------------------------------------------------------


def nvmlInit() -> None:  # pynvml's name
    """Start a session; reads the state file so a missing one fails here, like a missing driver."""
    global _initialized, _cache
    _load_state(_state_path())
    _initialized += 1
    _cache = None


def nvmlShutdown() -> None:
    """End a session (calls nest, as in NVML)."""
    global _initialized, _cache
    if not _initialized:
        raise NVMLError_Uninitialized()
    _initialized -= 1
    _cache = None


def nvmlSystemGetDriverVersion() -> str:
    """A plausible driver version."""
    _snapshot()
    return "550.127.05"


def nvmlSystemGetCudaDriverVersion() -> int:
    """CUDA 12.4, encoded as NVML does."""
    _snapshot()
    return 12040


def nvmlSystemGetProcessName(pid: int) -> str:
    """Name of a process on a GPU (foreign ones carry theirs in the state file)."""
    snap = _snapshot()
    if pid in snap.names:
        return snap.names[pid]
    try:
        with open(f"/proc/{int(pid)}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        raise NVMLError_NotFound() from None


def nvmlDeviceGetCount() -> int:
    """Number of simulated GPUs on this node."""
    return len(_snapshot().state.get("gpus", []))


def nvmlDeviceGetHandleByIndex(index: int) -> _Device:
    """Handle of GPU ``index``; NVMLError_InvalidArgument when there is no such GPU."""
    if not isinstance(index, int) or not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument()
    return _Device(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Device:
    """Handle of the GPU with this UUID; NVMLError_NotFound when none has it."""
    want = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in _snapshot().state.get("gpus", []):
        if gpu["uuid"] == want:
            return _Device(int(gpu["index"]))
    raise NVMLError_NotFound()


def nvmlDeviceGetIndex(handle: object) -> int:
    """Index of a GPU handle."""
    return int(_gpu(handle)["index"])


def nvmlDeviceGetName(handle: object) -> str:
    """Marketing name, e.g. ``NVIDIA A100-SXM4-80GB``."""
    return str(_gpu(handle)["name"])


def nvmlDeviceGetUUID(handle: object) -> str:
    """``GPU-<uuid>``, stable for a node name and index."""
    return str(_gpu(handle)["uuid"])


def nvmlDeviceGetMemoryInfo(handle: object, version: int | None = None) -> _Memory:
    """Total / used / free bytes; used is what the GPU's processes declared."""
    total, used = _used_bytes(_gpu(handle))
    return _Memory(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle: object) -> _Utilization:
    """0 % when idle; busy in proportion to the memory its processes hold."""
    gpu = _gpu(handle)
    if not _snapshot().procs.get(int(gpu["index"])):
        return _Utilization(gpu=0, memory=0)
    total, used = _used_bytes(gpu)
    frac = used / total if total else 0.0
    return _Utilization(gpu=min(100, round(60 + 40 * frac)), memory=min(100, round(50 * frac)))


def nvmlDeviceGetPowerUsage(handle: object) -> int:
    """Power draw in mW, between the model's idle and maximum draw by utilization."""
    gpu = _gpu(handle)
    idle, peak = int(gpu.get("power_idle_mw", 50_000)), int(gpu.get("power_max_mw", 300_000))
    return idle + (peak - idle) * nvmlDeviceGetUtilizationRates(handle).gpu // 100


def nvmlDeviceGetTemperature(handle: object, sensor: int = NVML_TEMPERATURE_GPU) -> int:
    """Degrees C, warmer when busy."""
    return 32 + nvmlDeviceGetUtilizationRates(handle).gpu * 4 // 10


def nvmlDeviceGetComputeRunningProcesses(handle: object) -> list[_ProcessInfo]:
    """Jobs of this node whose ``CUDA_VISIBLE_DEVICES`` includes the GPU, plus foreign ones."""
    gpu = _gpu(handle)
    return list(_snapshot().procs.get(int(gpu["index"]), []))


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle: object) -> list[_ProcessInfo]:
    """No graphics on a compute node."""
    _gpu(handle)
    return []


def nvmlDeviceGetPciInfo(handle: object) -> _PciInfo:
    """PCI address, ``busId`` like ``00000000:07:00.0``."""
    return _pci(str(_gpu(handle)["pci_bus_id"]))


def nvmlDeviceGetNvLinkState(handle: object, link: int) -> int:
    """1 when ``link`` is up, 0 when it exists but has no peer; NotSupported when absent."""
    gpu = _link(handle, link)
    return NVML_FEATURE_ENABLED if gpu.get("nvlink_peer") is not None else NVML_FEATURE_DISABLED


def nvmlDeviceGetNvLinkRemotePciInfo(handle: object, link: int) -> _PciInfo:
    """PCI address of the GPU at the other end of ``link``."""
    gpu = _link(handle, link)
    peer = gpu.get("nvlink_peer")
    if peer is None:
        raise NVMLError_NotSupported()
    return _pci(str(_snapshot().state["gpus"][int(peer)]["pci_bus_id"]))


nvmlDeviceGetNvLinkRemotePciInfo_v2 = nvmlDeviceGetNvLinkRemotePciInfo


def _pci(bus_id: str) -> _PciInfo:
    domain, bus, rest = bus_id.split(":")
    return _PciInfo(
        busId=bus_id, domain=int(domain, 16), bus=int(bus, 16), device=int(rest.split(".")[0], 16)
    )


def host_resources() -> dict[str, float]:
    """CPUs and host memory (GB) the simulated node has; NVML has no such call.

    The agent can prefer these over ``os.cpu_count()`` when it runs on a simulated node.
    """
    state = _load_state(_state_path())
    return {
        "cpus": float(state.get("cpus", os.cpu_count() or 1)),
        "mem_gb": float(state.get("mem_gb", 0.0)),
    }
