"""``%gpu`` / ``%%gpu``: run cells on a leased GPU, queue scripts, look at the cluster.

Loaded with ``%load_ext jupyter_gpusched``. Runs in the user's local kernel and speaks only the
REST API of the Jupyter server that started the kernel (found through ``$GPUSCHED_URL`` /
``$GPUSCHED_TOKEN``, which the server extension exports to its kernels, else the running-server
files of the runtime dir, preferring the kernel's parent server).

A ``%%gpu`` cell acquires (or reuses) a lease -- one per notebook by default, more with
``--lease NAME`` -- and runs in the lease's remote ipykernel (:mod:`.leases`). Arguments are
IPython ``magic_arguments``, one parser per line command; every failure a user should read is
an :class:`~IPython.core.error.UsageError`: one line, no traceback.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from jupyter_gpusched.core.api import JobView, NotebookSubmitted
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.progress import ProgressFilter
from jupyter_gpusched.core.units import parse_duration_s, parse_size_gb

from .api import GpuSchedClient, find_server
from .leases import LeaseKeeper, discover, session_name
from .lines import standing
from .options import HELP, parse_parameter, resource_fields


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type keeping our message (``'lots' is not a size; write it like 16G``)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


COUNT, SIZE, DURATION = _typed(_count), _typed(parse_size_gb), _typed(parse_duration_s)


def _resources(func: Any) -> Any:
    """The resource options every job request takes (%%gpu, submit, submit-notebook)."""
    for deco in reversed(
        [
            argument("--gpus", type=COUNT, default=1, help=HELP["gpus"]),
            argument("--mem", type=SIZE, help=HELP["mem"]),
            argument("--share", type=float, help=HELP["share"]),
            argument("--model", action="append", default=[], help=HELP["model"]),
            argument("--max-runtime", type=DURATION, help=HELP["max-runtime"]),
        ]
    ):
        func = deco(func)
    return func


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return resource_fields(
        gpus=args.gpus,
        gpu_mem_gb=args.mem,
        share=args.share,
        models=args.model,
        max_runtime_s=args.max_runtime,
    )


#: The %%gpu options that describe the lease, and the request fields they set.
_ASKED = {"--gpus": "gpus", "--mem": "gpu_mem_gb", "--share": "gpu_share", "--model": "gpu_models"}


def _given(argv: list[str], option: str) -> bool:
    """Whether the user wrote ``option`` (as ``--gpus 2`` or ``--gpus=2``)."""
    return any(a == option or a.startswith(option + "=") for a in argv)


def _parse(func: Any, argv: list[str], *, partial: bool = False) -> Any:
    """``argv`` by ``func``'s magic_arguments parser; ``--help`` prints its help (None)."""
    parser = func.parser
    if "-h" in argv or "--help" in argv:
        print(parser.format_help())
        return None
    try:
        return parser.parse_known_args(argv) if partial else parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(f"{exc} (see {parser.prog} --help)") from None


@magics_class
class GpuMagics(Magics):
    """``%gpu`` (line: subcommands) and ``%%gpu`` (cell: run remotely)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._client: GpuSchedClient | None = None
        self.leases = LeaseKeeper(lambda: self.client, session_name())
        atexit.register(self.release_all)

    @property
    def client(self) -> GpuSchedClient:
        """The REST client, found on first use."""
        if self._client is None:
            try:
                info = discover()
            except GpuSchedError as exc:
                raise UsageError(exc.message) from None
            self._client = GpuSchedClient(info.url, info.token)
        return self._client

    def release_all(self) -> None:
        """Give back every lease of this kernel (kernel shutdown; a gone server is no wait)."""
        if self._client is not None:
            self._client = GpuSchedClient(self._client.url, self._client.token, timeout_s=3.0)
        self.leases.release_all()

    # -- entry point --------------------------------------------------------------------------

    @magic_arguments(name="%%gpu")
    @_resources
    @argument("--lease", default="default", help="Lease name; one remote kernel per name.")
    @argument("--timeout", type=DURATION, help="Give up waiting for the lease after this.")
    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        """Run this cell on a leased GPU (variables persist); ``%gpu COMMAND`` does the rest.

        Line commands: release, status, queue, submit, submit-notebook, cancel, logs, leases,
        config (``%gpu COMMAND --help`` for each).
        """
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"cannot read the arguments: {exc}") from None
        if cell is None:
            return self._line(argv)
        args = _parse(self.gpu, argv)
        if args is None:
            return None
        if args.gpus == 0:
            raise UsageError(
                "--gpus 0: a %%gpu cell needs at least 1 GPU (run CPU-only code without %%gpu)"
            )
        fields = _fields(args)
        asked = {f: fields[f] for opt, f in _ASKED.items() if _given(argv, opt) and f in fields}
        return self.leases.run_cell(cell, args.lease, fields, args.timeout, asked=asked)

    def _line(self, argv: list[str]) -> Any:
        commands = {
            "release": self._release,
            "status": self._status,
            "queue": self._queue,
            "submit": self._submit,
            "submit-notebook": self._submit_notebook,
            "cancel": self._cancel,
            "logs": self._logs,
            "leases": self._leases,
            "config": self._config,
        }
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(
                "usage: %gpu {" + ",".join(commands) + "} ...   (%%gpu runs a cell on a GPU; "
                "%gpu COMMAND --help for details)"
            )
            return None
        command = commands.get(argv[0])
        if command is None:
            raise UsageError(f"unknown command {argv[0]!r}; use one of {', '.join(commands)}")
        return command(argv[1:])

    # -- line commands ------------------------------------------------------------------------

    @magic_arguments(name="%gpu release")
    @argument("--lease", default="default", help="Lease name (default: default).")
    @argument("--all", action="store_true", help="Every lease of this notebook.")
    def _release(self, argv: list[str]) -> None:
        """Release a lease and free its GPUs."""
        if (args := _parse(self._release, argv)) is None:
            return
        names = list(self.leases.leases) if args.all else [args.lease]
        released = self.leases.release(names)
        if not released:
            print("%gpu: no lease to release")
        else:
            print(f"%gpu: released lease {', '.join(map(str, released))}")

    @magic_arguments(name="%gpu status")
    def _status(self, argv: list[str]) -> Any:
        """Show the cluster map, live."""
        if _parse(self._status, argv) is None:
            return None
        from .widgets import ClusterMap

        widget = ClusterMap(client=self.client)
        widget.refresh()
        widget.follow()
        return widget

    @magic_arguments(name="%gpu queue")
    @argument("--all", action="store_true", help="Include ended jobs.")
    @argument("--limit", type=COUNT, default=50, help="At most this many jobs.")
    def _queue(self, argv: list[str]) -> None:
        """Jobs queued or running."""
        from jupyter_gpusched.cli.formats import format_queue

        if (args := _parse(self._queue, argv)) is None:
            return
        states = None if args.all else "queued,starting,running"
        page = self.leases.call(self.client.list_jobs, state=states, limit=args.limit)
        print(format_queue(page.jobs, total=page.total))

    @magic_arguments(name="%gpu submit")
    @_resources
    @argument("--name", help=HELP["name"])
    @argument("--priority", choices=("interactive", "batch"), help=HELP["priority"])
    @argument(
        "--staged",
        action="store_true",
        help="Run the staged copy in the job's directory on the node (default: in this "
        "notebook's directory, for nodes sharing it).",
    )
    def _submit(self, argv: list[str]) -> JobView | None:
        """Queue a script: %gpu submit train.py [ARGS] --gpus 2; after '--' all is the script's."""
        ours, script_args = argv, []
        if "--" in argv:
            cut = argv.index("--")
            ours, script_args = argv[:cut], argv[cut + 1 :]
        if (parsed := _parse(self._submit, ours, partial=True)) is None:
            return None
        args, rest = parsed
        rest += script_args
        if not rest:
            raise UsageError("give the script to run, e.g. %gpu submit train.py --gpus 1")
        script, script_argv = rest[0], rest[1:]
        if not os.path.isfile(script):
            raise UsageError(f"no file {script!r} in {os.getcwd()}")
        run = os.path.basename(script) if args.staged else script
        command = ["python3", run] if script.endswith(".py") else [f"./{run}"]
        spec: dict[str, Any] = {
            "kind": "script",
            "command": [*command, *script_argv],
            "files": [os.path.abspath(script)],
            "name": args.name or os.path.basename(script),
            **_fields(args),
        }
        if not args.staged:
            spec["workdir"] = os.getcwd()
        if args.priority:
            spec["priority"] = args.priority
        job: JobView = self.leases.call(self.client.submit, spec)
        print(f"%gpu: submitted job {job.id} ({standing(job)}); follow it with %gpu logs {job.id}")
        return job

    @magic_arguments(name="%gpu submit-notebook")
    @argument("notebook", help=HELP["notebook"])
    @argument("-p", "--parameter", action="append", default=[], help=HELP["parameter"])
    @argument("--at", default="now", help=HELP["at"])
    @argument("--kernel", help=HELP["kernel"])
    @argument("--name", help=HELP["name"])
    @_resources
    def _submit_notebook(self, argv: list[str]) -> NotebookSubmitted | None:
        """Run a notebook as a batch job: %gpu submit-notebook nb.ipynb -p lr=0.1 --at tonight.

        The executed copy comes back beside it with a timestamped name.
        """
        if (args := _parse(self._submit_notebook, argv)) is None:
            return None
        if not os.path.isfile(args.notebook):
            raise UsageError(f"no notebook {args.notebook!r} in {os.getcwd()}")
        try:
            parameters = dict(parse_parameter(text) for text in args.parameter)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        fields = {"parameters": parameters, "at": args.at, **_fields(args)}
        if args.kernel:
            fields["kernel_name"] = args.kernel
        if args.name:
            fields["name"] = args.name
        path = os.path.abspath(args.notebook)
        answer = self.leases.call(self.client.submit_notebook, path, **fields)
        if answer.definition is not None:
            print(
                f"%gpu: scheduled {args.notebook} as definition {answer.definition.id} "
                f"({args.at}); list them with 'jupyter gpusched definitions'"
            )
        elif answer.job is not None:
            job = answer.job
            print(
                f"%gpu: submitted {args.notebook} as job {job.id} ({standing(job)}); "
                f"follow it with %gpu logs {job.id}"
            )
        return answer

    @magic_arguments(name="%gpu cancel")
    @argument("ids", nargs="+", type=COUNT, metavar="ID")
    def _cancel(self, argv: list[str]) -> None:
        """Cancel queued or running jobs."""
        if (args := _parse(self._cancel, argv)) is None:
            return
        for job_id in args.ids:
            job = self.leases.call(self.client.cancel, job_id)
            print(f"%gpu: job {job_id} {job.state.value}")

    @magic_arguments(name="%gpu logs")
    @argument("id", type=COUNT, metavar="ID")
    @argument("--follow", "-f", action="store_true", help="Until the job ends.")
    def _logs(self, argv: list[str]) -> None:
        """Print a job's output."""
        if (args := _parse(self._logs, argv)) is None:
            return
        shown = ProgressFilter()  # a notebook job's progress lines are not for reading
        if args.follow:
            for chunk in self.leases.call(lambda: list(self.client.follow_log(args.id))):
                sys.stdout.write(shown.feed(chunk).decode(errors="replace"))
        else:
            offset = 0
            while True:
                data, offset = self.leases.call(self.client.read_log, args.id, offset=offset)
                if not data:
                    break
                sys.stdout.write(shown.feed(data).decode(errors="replace"))
        sys.stdout.write(shown.close().decode(errors="replace"))
        sys.stdout.flush()

    @magic_arguments(name="%gpu leases")
    def _leases(self, argv: list[str]) -> None:
        """My live leases."""
        from jupyter_gpusched.cli.formats import format_queue

        if _parse(self._leases, argv) is None:
            return
        print(format_queue(self.leases.call(self.client.leases)))

    @magic_arguments(name="%gpu config")
    @argument("--url", help="Server URL with base_url, e.g. http://127.0.0.1:8888/.")
    @argument("--token", default="", help="The server's token.")
    def _config(self, argv: list[str]) -> None:
        """Which server to talk to."""
        if (args := _parse(self._config, argv)) is None:
            return
        if args.url:
            info = self.leases.call(find_server, args.url, args.token)
            self._client = GpuSchedClient(info.url, info.token)
        print(f"%gpu: server {self.client.url}")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%gpu`` and ``%%gpu``."""
    ipython.register_magics(GpuMagics)
