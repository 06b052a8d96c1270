"""``jupyter gpusched SUBCOMMAND``: dispatch to the module that owns each subcommand.

Each subcommand lives beside the layer it serves and owns its own argparse parser, so this
module stays a table. Heavy imports happen only for the subcommand that runs.
"""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "simulate": (
        "jupyter_gpusched.packing.simulate",
        "main",
        "replay a GPU-cluster trace on the packer",
    ),
    "policy": ("jupyter_gpusched.cli.policy", "main", "explain which rules hold at a time"),
    "demo": ("jupyter_gpusched.cli.demo", "main", "run a short workload on the embedded cluster"),
    "submit": ("jupyter_gpusched.cli.jobs", "submit_main", "queue a script on the cluster"),
    "queue": ("jupyter_gpusched.cli.jobs", "queue_main", "show queued and running jobs"),
    "cancel": ("jupyter_gpusched.cli.jobs", "cancel_main", "cancel jobs by id"),
    "logs": ("jupyter_gpusched.cli.jobs", "logs_main", "print (-f: follow) a job's output"),
    "nodes": ("jupyter_gpusched.cli.jobs", "nodes_main", "show the cluster map, a glyph per GPU"),
    "submit-notebook": ("jupyter_gpusched.cli.notebooks", "submit_main", "run a notebook job"),
    "definitions": ("jupyter_gpusched.cli.notebooks", "definitions_main", "recurring notebooks"),
    "service": (
        "jupyter_gpusched.server.service",
        "main",
        "run the lab-wide queue as a service ('service token USER' mints a user's token)",
    ),
}


def _usage() -> str:
    lines = ["usage: jupyter gpusched COMMAND [options]", "", "commands:"]
    width = max(len(c) for c in COMMANDS)
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "Run 'jupyter gpusched COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jupyter-gpusched`` console script."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"jupyter gpusched: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    code = getattr(importlib.import_module(module), func)(rest)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
