"""jupyter-gpusched: one GPU queue for a lab, living in Jupyter.

This module is imported on GPU nodes too (``jupyter_gpusched.node`` runs there on the base
install): it imports nothing beyond the standard library at module level.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_gpusched``: register the ``%gpu`` / ``%%gpu`` magics.

    Imported lazily so that importing the server extension never imports IPython.
    """
    from .client.magics import load_ipython_extension as _load

    _load(ipython)


def checkpointed(when: float | None = None) -> None:
    """Tell the scheduler a checkpoint was saved (call it in a job right after saving one).

    A preempted or moved job is then charged only the work since this moment. Does nothing
    outside a gpusched job.
    """
    import os
    import time

    path = os.environ.get("GPUSCHED_CHECKPOINT_FILE")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{time.time() if when is None else when:.3f}\n")
        os.replace(tmp, path)  # the poll never reads half a line


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Where jupyter_server finds the extension app (imported only when the server loads it).

    The wheel's server config enables the extension wherever the package is installed, also on
    a GPU node's base install, which lacks the extension's dependencies: say how to get them.
    """
    try:
        from .server.app import GpuSchedApp
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith(__name__):
            raise
        raise ModuleNotFoundError(
            f"the jupyter_gpusched server extension needs {exc.name!r}, one of the Jupyter "
            'host\'s dependencies: pip install "jupyter-gpusched[server]"',
            name=exc.name,
        ) from None
    return [{"module": "jupyter_gpusched.server.app", "app": GpuSchedApp}]
