"""What a node has: its GPUs (through NVML, or nvidia-smi without it), CPUs and memory.

Runs on the node under the agent (``python -m jupyter_gpusched.node.agent probe``): standard
library only at the top; pynvml (or the module ``$GPUSCHED_NVML_MODULE`` names, e.g. the
simulator's) is imported when probing. GPU processes started by a gpusched job are marked
with the job's id (from ``$GPUSCHED_JOB_ID`` in their environment) so the scheduler can tell
its own processes from foreign ones.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

#: Environment variable every job (and its children) carries; marks GPU processes as ours.
JOB_ID_ENV = "GPUSCHED_JOB_ID"
_SMI_GPU_FIELDS = "index,uuid,name,memory.total,memory.used,utilization.gpu,power.draw,pci.bus_id"
_SMI_APP_FIELDS = "gpu_uuid,pid,used_memory,process_name"


class AgentError(Exception):
    """A failure reported to the caller as ``{"error": message}``."""


def short_model(name: str) -> str:
    """Normalise a marketing GPU name to the short model the packer matches on.

    ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-80GB"``, ``"Tesla V100-SXM2-32GB"`` -> ``"V100-32GB"``,
    ``"NVIDIA GeForce RTX 4090"`` -> ``"RTX-4090"``, ``"Tesla T4"`` -> ``"T4"``.
    """
    words = name.replace("NVIDIA", " ").replace("Tesla", " ").replace("GeForce", " ").split()
    parts = "-".join(words).split("-")
    form_factors = re.compile(r"^(SXM\d*|PCIE|PCIe|NVL|HBM\d*e?|MIG.*)$", re.IGNORECASE)
    kept = [p for p in parts if p and not form_factors.match(p)]
    return "-".join(kept) or name.strip()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _job_id_of(pid: int) -> int | None:
    """The gpusched job a process belongs to, from its environment; None = foreign or unknown.

    Another user's processes cannot be read, which rightly makes them foreign.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    prefix = JOB_ID_ENV.encode() + b"="
    for item in env:
        if item.startswith(prefix):
            try:
                return int(item[len(prefix) :])
            except ValueError:
                return None
    return None


def _user_of(pid: int) -> str | None:
    """The account a process runs as (``/proc/PID`` is its owner's, readable by anyone).

    When jobs run as their owners the probe, run as the scheduler's account, cannot read
    their environment; the scheduler then tells them by owner and GPU instead.
    """
    import pwd

    try:
        return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        return None


def _process(pid: int, used_mem_mb: float, name: str = "") -> dict[str, Any]:
    job_id = _job_id_of(pid)
    return {
        "pid": pid,
        "used_mem_mb": used_mem_mb,
        "name": name or _proc_name(pid),
        "job_id": job_id,
        "user": _user_of(pid) if job_id is None else None,
    }


def _probe_nvml(module_name: str) -> list[dict[str, Any]]:
    """GPUs through NVML; raises ImportError or the module's NVMLError when unavailable."""
    import importlib

    nv = importlib.import_module(module_name)
    nv.nvmlInit()
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        bus_ids = [_text(nv.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
        gpus = []
        for index, h in enumerate(handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                power_w: float | None = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            except nv.NVMLError:
                power_w = None
            try:
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except nv.NVMLError:
                util = 0.0
            peers: set[int] = set()
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    if not nv.nvmlDeviceGetNvLinkState(h, link):
                        continue
                    remote = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
                except nv.NVMLError:
                    # links that do not exist or GPUs without NVLink answer with an error
                    continue
                if remote in bus_ids and bus_ids.index(remote) != index:
                    peers.add(bus_ids.index(remote))
            try:
                running = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except nv.NVMLError:
                running = []  # e.g. MIG parents; the GPU is still reported
            procs = [_process(p.pid, (p.usedGpuMemory or 0) / 2**20) for p in running]
            name = _text(nv.nvmlDeviceGetName(h))
            gpus.append(
                {
                    "index": index,
                    "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                    "model": short_model(name),
                    "mem_total_mb": mem.total / 2**20,
                    "mem_used_mb": mem.used / 2**20,
                    "util_pct": util,
                    "power_w": power_w,
                    "nvlink_peers": sorted(peers),
                    "processes": procs,
                }
            )
        return gpus
    finally:
        nv.nvmlShutdown()


def _smi_number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _smi_rows(args: list[str]) -> list[list[str]]:
    import csv
    import io
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out)) if row]


def _smi_nvlink_peers() -> dict[int, set[int]]:
    """NVLink pairs from ``nvidia-smi topo -m`` (entries ``NV1``..``NV18``); empty if unknown."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    if not lines:
        return {}
    columns = [c for c in lines[0] if re.fullmatch(r"GPU\d+", c)]
    peers: dict[int, set[int]] = {}
    for row in lines[1:]:
        if not row or not re.fullmatch(r"GPU\d+", row[0]):
            continue
        me = int(row[0][3:])
        for col, cell in zip(columns, row[1:], strict=False):
            if re.fullmatch(r"NV\d+", cell):
                peers.setdefault(me, set()).add(int(col[3:]))
    return peers


def _probe_smi() -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi`` CSV; raises OSError when there is no nvidia-smi."""
    rows = _smi_rows([f"--query-gpu={_SMI_GPU_FIELDS}", "--format=csv,noheader,nounits"])
    apps = _smi_rows([f"--query-compute-apps={_SMI_APP_FIELDS}", "--format=csv,noheader,nounits"])
    peers = _smi_nvlink_peers()
    gpus = []
    for index, uuid, name, total, used, util, power, _bus in (r[:8] for r in rows):
        procs = [
            _process(int(pid), _smi_number(mem) or 0.0, os.path.basename(pname))
            for gpu_uuid, pid, mem, pname in (a[:4] for a in apps)
            if gpu_uuid == uuid
        ]
        gpus.append(
            {
                "index": int(index),
                "uuid": uuid,
                "model": short_model(name),
                "mem_total_mb": _smi_number(total) or 0.0,
                "mem_used_mb": _smi_number(used) or 0.0,
                "util_pct": _smi_number(util) or 0.0,
                "power_w": _smi_number(power),
                "nvlink_peers": sorted(peers.get(int(index), ())),
                "processes": procs,
            }
        )
    return gpus


def _mem_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def probe() -> dict[str, Any]:
    """What this node has: NVML first, then nvidia-smi, else no GPUs (``source: none``)."""
    import socket
    import subprocess

    configured = os.environ.get("GPUSCHED_NVML_MODULE")
    source, gpus = "none", []
    try:
        gpus, source = _probe_nvml(configured or "pynvml"), "nvml"
    except Exception as exc:  # noqa: BLE001 - any NVML failure means "try nvidia-smi"
        if configured:
            # a configured simulator that fails is a bug worth seeing, not a GPU-less node
            raise AgentError(f"NVML module {configured!r} failed: {exc}") from None
        try:
            gpus, source = _probe_smi(), "nvidia-smi"
        except (OSError, subprocess.SubprocessError, ValueError):
            source, gpus = "none", []
    host = {"cpus": float(os.cpu_count() or 1), "mem_gb": _mem_gb()}
    simulated = getattr(sys.modules.get(configured or ""), "host_resources", None)
    if source == "nvml" and simulated is not None:
        host.update(simulated())  # a simulated node has its own CPU and memory sizes
    return {
        "hostname": socket.gethostname(),
        "cpus": host["cpus"],
        "mem_gb": host["mem_gb"],
        "source": source,
        "gpus": gpus,
    }


# --------------------------------------------------------------------------- launch
