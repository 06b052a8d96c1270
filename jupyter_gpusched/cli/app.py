"""The ``jupyter-gpusched`` console script: a plain ``queue`` quickly, the rest by the app.

A ``queue`` made only of its own options is answered by :mod:`.quick` without importing the
traitlets application or pydantic (it is typed as often as ``squeue``); everything else --
another command, ``--help``, a misspelt option, a config file -- runs
:class:`~jupyter_gpusched.cli.commands.GpuSchedCLI` as before. The application's names
(``GpuSchedCLI``, ``SUBCOMMANDS``, ...) are read here too, imported when first asked for.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jupyter-gpusched`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from .quick import quick_queue

    code = quick_queue(argv)
    if code is not None:
        return code
    from .base import run_command
    from .commands import GpuSchedCLI

    return run_command(GpuSchedCLI, argv)


def __getattr__(name: str) -> Any:
    """``GpuSchedCLI``, ``SUBCOMMANDS``, ...: the application's, from :mod:`.commands`."""
    if name.startswith("__"):
        raise AttributeError(name)
    from . import commands

    try:
        return getattr(commands, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    sys.exit(main())
