"""GPU kernelspecs: what "Python 3 (1 GPU)" asks for, and where a notebook may ask for more.

A GPU kernelspec is an ordinary ``kernel.json`` whose ``metadata.kernel_provisioner`` names
:data:`PROVISIONER_NAME` (:class:`~jupyter_gpusched.client.provisioner.GpuLeaseProvisioner`)
with the lease's resources as its ``config``. A notebook may change them in its own metadata,
``metadata.gpusched.kernel`` (same keys), e.g. ``{"gpus": 2, "gpu_models": ["A100"]}``. The
package installs two specs (``share/jupyter/kernels/gpusched-*``); ``jupyter gpusched
kernelspec add`` writes a lab's own with :func:`install`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.core.units import format_size_gb, parse_duration_s, parse_size_gb

#: The provisioner's entry point in the ``jupyter_client.kernel_provisioners`` group.
PROVISIONER_NAME = "gpusched-provisioner"
#: The lease fields a kernelspec or a notebook may set, and how each is read.
FIELDS: dict[str, Any] = {
    "gpus": int,
    "gpu_mem_gb": parse_size_gb,
    "gpu_share": float,
    "gpu_models": lambda v: [str(m) for m in ([v] if isinstance(v, str) else v)],
    "cpus": float,
    "mem_gb": parse_size_gb,
    "max_runtime_s": parse_duration_s,
    "priority": str,
}
#: The launcher's icon of GPU kernels (a GPU board, as the lab panel's).
LOGO = os.path.join(os.path.dirname(__file__), "kernel-logo.svg")
#: Where a notebook's metadata holds its own request.
NOTEBOOK_KEY = ("gpusched", "kernel")


def lease_fields(*sources: Mapping[str, Any] | None, where: str = "request") -> dict[str, Any]:
    """The lease fields of ``sources`` merged (later ones win), each read into its type.

    Unknown keys and unreadable values raise :class:`InvalidSpecError` naming ``where``
    (the kernelspec, or the notebook's metadata), so the user knows what to fix.
    """
    merged: dict[str, Any] = {}
    for source in sources:
        for key, value in (source or {}).items():
            if key not in FIELDS:
                raise InvalidSpecError(
                    f"{where}.{key}", f"unknown field; use one of {', '.join(FIELDS)}"
                )
            if value is None:
                merged.pop(key, None)
                continue
            try:
                merged[key] = FIELDS[key](value)
            except (TypeError, ValueError) as exc:
                raise InvalidSpecError(f"{where}.{key}", str(exc)) from None
    return merged


def notebook_fields(path: str | None) -> dict[str, Any]:
    """A notebook's own request (``metadata.gpusched.kernel``); {} when it has none or is new."""
    if not path or not path.endswith(".ipynb"):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f).get("metadata", {})
    except (OSError, ValueError, AttributeError):
        return {}  # not saved yet, or not a notebook we can read: the kernelspec decides
    section: Any = meta
    for key in NOTEBOOK_KEY:
        section = section.get(key) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        return {}
    return lease_fields(section, where="metadata." + ".".join(NOTEBOOK_KEY))


def describe(fields: Mapping[str, Any]) -> str:
    """``1 GPU``, ``2 GPUs, 40 GB each, A100``, ``1 GPU, 24 GB share``: for display names."""
    gpus = int(fields.get("gpus", 1))
    parts = [f"{gpus} GPU" + ("s" if gpus != 1 else "")]
    if fields.get("gpu_mem_gb"):
        size = format_size_gb(float(fields["gpu_mem_gb"])).replace("G", " GB")
        parts.append(f"{size} share" if gpus == 1 else f"{size} each")
    elif fields.get("gpu_share"):
        parts.append(f"{float(fields['gpu_share']):g} of a GPU")
    if fields.get("gpu_models"):
        parts.append("/".join(fields["gpu_models"]))
    return ", ".join(parts)


def kernel_spec(fields: Mapping[str, Any], display_name: str | None = None) -> dict[str, Any]:
    """The ``kernel.json`` of a GPU kernel asking for ``fields``.

    ``argv`` is what the remote node runs in spirit (an ipykernel); the provisioner ignores
    it and starts the lease's kernel instead. Interrupts go as messages: a signal cannot reach
    a process on another machine.
    """
    fields = lease_fields(fields, where="kernelspec")
    return {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name or f"Python 3 ({describe(fields)})",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": fields},
        },
    }


def install(
    name: str,
    fields: Mapping[str, Any],
    *,
    display_name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
) -> str:
    """Install a GPU kernelspec as ``name`` (like ``jupyter kernelspec install``); its path."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = kernel_spec(fields, display_name)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, name)
        os.mkdir(src)
        with open(os.path.join(src, "kernel.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, indent=1)
            f.write("\n")
        shutil.copy(LOGO, os.path.join(src, "logo-svg.svg"))
        return str(
            KernelSpecManager().install_kernel_spec(src, kernel_name=name, user=user, prefix=prefix)
        )
