"""Options that ``jupyter gpusched`` and the ``%gpu`` magic share: their help, once.

The command's options are traits and the magic's are IPython ``magic_arguments``; both take
their words from :data:`HELP` and read values with the same functions, so ``--mem 16G`` or
``-p lr=0.1`` mean the same wherever they are typed.
"""

from __future__ import annotations

import ast
import json
from typing import Any

HELP: dict[str, str] = {
    "gpus": "GPUs, all on one node (default 1).",
    "mem": "GPU memory needed on each GPU, e.g. 16G: a share of a GPU, which other jobs asking "
    "for memory or a share may use too (without --mem or --share a job's GPUs are its own).",
    "share": "Share of one GPU (0-1], e.g. 0.5; the rest may go to other shared jobs.",
    "model": "Allowed GPU model, e.g. A100 (repeat the option for more).",
    "max-runtime": "Stop after this long, e.g. 2h.",
    "name": "Display name of the job.",
    "priority": "Priority class: interactive or batch.",
    "notebook": "Path of the .ipynb to run.",
    "parameter": "NAME=VALUE, a parameter of the notebook (repeat); VALUE is read as JSON or a "
    "Python literal, else as text: lr=0.1, epochs=3, tag=base.",
    "at": "When: now, tonight, a window name, an ISO time, or a cron expression like "
    "'0 2 * * *' (a recurring definition).",
    "kernel": "Kernel name (default: the notebook's).",
}


#: Request fields -> the option that sets them, to name the option in a refusal.
OPTION_OF = {
    "gpus": "--gpus",
    "gpu_mem_gb": "--mem",
    "gpu_share": "--share",
    "gpu_models": "--model",
    "max_runtime_s": "--max-runtime",
    "cpus": "--cpus",
    "mem_gb": "--host-mem",
    "name": "--name",
}


def parse_parameter(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with a typed value: JSON or a Python literal, else the text itself.

    ``lr=0.1`` -> float, ``epochs=3`` -> int, ``fast=true`` / ``fast=True`` -> bool,
    ``layers=[64,32]`` -> list, ``cfg={"a": 1}`` -> dict, ``name=resnet`` -> str.
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(f"{text!r} is not NAME=VALUE with a valid variable name")
    for parse in (json.loads, ast.literal_eval):
        try:
            return name, parse(raw)
        except (ValueError, SyntaxError, RecursionError):
            continue
    return name, raw


def resource_fields(
    *,
    gpus: int | None = None,
    gpu_mem_gb: float | None = None,
    share: float | None = None,
    models: list[str] | None = None,
    max_runtime_s: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The request fields of the resource options given (the server's defaults for the rest)."""
    fields = {
        "gpus": gpus,
        "gpu_mem_gb": gpu_mem_gb,
        "gpu_share": share,
        "gpu_models": list(models) if models else None,
        "max_runtime_s": max_runtime_s,
        **more,
    }
    return {k: v for k, v in fields.items() if v is not None}
