"""``jupyter gpusched SUBCOMMAND``: one JupyterApp whose subcommands live beside their layer.

(The console script's entry point is :func:`jupyter_gpusched.cli.app.main`, which answers a
plain ``queue`` itself, :mod:`.quick`, and runs this for the rest.)

Subcommands are named by import string, so only the one that runs is imported: ``jupyter
gpusched queue`` loads the REST client, never the server, the store or the simulator. Every
subcommand reads ``jupyter_gpusched_config.py`` and takes ``--Class.trait=value`` options, as
every Jupyter command does (``jupyter gpusched queue --help-all`` lists them).
"""

from __future__ import annotations

import sys
from typing import Any

from jupyter_core.application import JupyterApp

from jupyter_gpusched import __version__

from .base import GpuSchedCommand

#: subcommand -> (import string of its app, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("jupyter_gpusched.cli.jobs.SubmitApp", "Queue a script on the cluster."),
    "queue": ("jupyter_gpusched.cli.jobs.QueueApp", "Show queued and running jobs."),
    "cancel": ("jupyter_gpusched.cli.jobs.CancelApp", "Cancel jobs by id."),
    "logs": ("jupyter_gpusched.cli.jobs.LogsApp", "Print (-f: follow) a job's output."),
    "nodes": ("jupyter_gpusched.cli.jobs.NodesApp", "Show the cluster map, a glyph per GPU."),
    "submit-notebook": (
        "jupyter_gpusched.cli.notebooks.SubmitNotebookApp",
        "Run a notebook as a batch job, now, later or on a cron schedule.",
    ),
    "definitions": (
        "jupyter_gpusched.cli.notebooks.DefinitionsApp",
        "List, show, pause, resume or delete recurring notebook jobs.",
    ),
    "kernelspec": (
        "jupyter_gpusched.cli.kernelspecs.KernelspecApp",
        "Install a GPU kernel for the launcher (add), or list them.",
    ),
    "policy": ("jupyter_gpusched.cli.policy.PolicyApp", "Explain which rules hold at a time."),
    "demo": ("jupyter_gpusched.cli.demo.DemoApp", "Run a short workload on the embedded cluster."),
    "simulate": ("jupyter_gpusched.cli.commands.SimulateApp", "Replay a GPU-cluster trace."),
    "service": (
        "jupyter_gpusched.cli.commands.ServiceApp",
        "Run the lab-wide queue as a service ('service token USER' mints a user's token).",
    ),
}


class GpuSchedCLI(GpuSchedCommand):
    """The ``jupyter gpusched`` command: dispatches to its subcommands."""

    description = "One GPU queue for a lab, living in Jupyter: the scheduler from a terminal."
    version = __version__
    subcommands = {name: (app, help_) for name, (app, help_) in SUBCOMMANDS.items()}

    def start(self) -> None:
        """Run the subcommand; with none, list them."""
        if self.subapp is None:
            if self.extra_args:
                self.fail(
                    f"unknown command {self.extra_args[0]!r}; one of {', '.join(SUBCOMMANDS)}"
                )
            self.print_subcommands()
            self.exit(0)
        self.subapp.start()


class SimulateApp(JupyterApp):
    """``jupyter gpusched simulate``: the packer's trace replay, which keeps its own options.

    The replay lives in the pure :mod:`jupyter_gpusched.packing.simulate`, whose argparse
    options this passes through as they are (``jupyter gpusched simulate --help``).
    """

    name = "jupyter-gpusched"
    description = "Replay a GPU-cluster trace on the packer."

    def initialize(self, argv: Any = None) -> None:  # noqa: D102
        self.argv_rest = list(sys.argv[1:] if argv is None else argv)

    def start(self) -> None:  # noqa: D102
        from jupyter_gpusched.core.cmdline import OptionError, check_argparse
        from jupyter_gpusched.packing.simulate import _parser, main

        try:
            check_argparse(_parser(), self.argv_rest)
        except OptionError as exc:
            prog = "jupyter gpusched simulate"
            print(f"{prog}: error: {exc} (see {prog} --help)", file=sys.stderr)
            self.exit(2)
        try:
            code = main(self.argv_rest)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
        self.exit(code)


class ServiceApp(JupyterApp):
    """``jupyter gpusched service``: the lab-wide service, a server application of its own.

    It is launched as the server it is (:class:`~jupyter_gpusched.server.service.
    GpuSchedService` with its own options, config file and ``token`` subcommand), so the
    server's own start-up and shutdown run as in ``jupyter server``.
    """

    name = "jupyter-gpusched"
    description = "Run the lab-wide queue as a service."

    def initialize(self, argv: Any = None) -> None:  # noqa: D102
        self.argv_rest = list(sys.argv[1:] if argv is None else argv)

    def start(self) -> None:  # noqa: D102
        from jupyter_gpusched.server.service import GpuSchedService

        type(self).clear_instance()  # the server is the one application singleton from here
        GpuSchedService.launch_instance(argv=self.argv_rest)
