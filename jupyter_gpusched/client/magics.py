"""``%gpu`` / ``%%gpu``: run cells on a leased GPU, queue scripts, look at the cluster.

Loaded with ``%load_ext jupyter_gpusched``. Runs in the user's local kernel and speaks only the
REST API of the Jupyter server that started the kernel (found through ``$GPUSCHED_URL`` /
``$GPUSCHED_TOKEN``, which the server extension exports to its kernels, else the running-server
files of the runtime dir, preferring the kernel's parent server).

A ``%%gpu`` cell acquires (or reuses) a lease -- one per notebook by default, more with
``--lease NAME`` -- and runs in the lease's remote ipykernel (:mod:`.leases`). The options of
``%%gpu``, ``submit`` and ``submit-notebook`` are the job options of the CLI, from the one
grammar of :mod:`.options` (the same spelling, help and meaning; a misspelt one names the one
meant); the other line commands use IPython ``magic_arguments``. Every failure a user should
read is an :class:`~IPython.core.error.UsageError`: one line, no traceback.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from jupyter_gpusched.core.api import JobView, NotebookSubmitted
from jupyter_gpusched.core.cmdline import check_argparse
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.progress import ProgressFilter

from .api import GpuSchedClient, find_server
from .leases import LeaseKeeper, discover, session_name
from .lines import standing
from .options import (
    OPTIONS,
    OptionError,
    argparser,
    merge_parameters,
    request_fields,
    spellings,
    split_argv,
)

#: The request fields that describe a lease: a cell asking for others is told so.
_ASKED = ("gpus", "gpu_mem_gb", "gpu_share", "gpu_models")


def _count(text: str) -> int:
    try:
        return OPTIONS["--gpus"].parse(text)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_count.__name__ = "count"

#: The usage line and help pointer of each command the grammar defines.
_USAGE = {
    "cell": ("%%gpu", "%%gpu [OPTIONS]\n<code>", "%gpu --help"),
    "submit": (
        "%gpu submit",
        "%gpu submit [OPTIONS] SCRIPT [ARGS ...] [-- ARGS ...]",
        "%gpu submit --help",
    ),
    "submit-notebook": (
        "%gpu submit-notebook",
        "%gpu submit-notebook [OPTIONS] NOTEBOOK",
        "%gpu submit-notebook --help",
    ),
}
_ABOUT = {
    "cell": "Run the cell on a leased GPU; later %%gpu cells reuse the lease, so variables "
    "persist.",
    "submit": "Queue a script: options first, then the script and its arguments (its own "
    "options after '--'). A .py file runs with python3.",
    "submit-notebook": "Run a notebook as a batch job; the executed copy comes back beside it "
    "with a timestamped name.",
}
_PARSERS = {
    command: argparser(command, prog, usage, _ABOUT[command])
    for command, (prog, usage, _) in _USAGE.items()
}
_COMMANDS_LINE = (
    "%gpu COMMAND [OPTIONS]: release, status, queue, submit, submit-notebook, cancel, logs, "
    "leases, config (%gpu COMMAND --help for each)"
)


def _grammar(command: str, argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """``(options, words before --, words after --)`` of a command the grammar defines.

    An unknown option is an error naming the one meant (``did you mean --gpus?``), never a
    word passed on to the script.
    """
    _, _, help_line = _USAGE[command]
    cut = argv.index("--") if "--" in argv else len(argv)
    before, after = argv[:cut], argv[cut + 1 :]
    takes_value, flags = spellings(command)
    hint = (
        "(the script's own options go after '--': %gpu submit [OPTIONS] SCRIPT -- ARGS ...)"
        if command == "submit"
        else ""
    )
    try:
        ours, words = split_argv(before, takes_value, flags, hint=hint)
        return _PARSERS[command].parse_args(ours), words, after
    except OptionError as exc:
        raise UsageError(f"{exc} (see {help_line})") from None


def _wants_help(argv: list[str]) -> bool:
    cut = argv.index("--") if "--" in argv else len(argv)
    return "-h" in argv[:cut] or "--help" in argv[:cut]


def _parse(func: Any, argv: list[str]) -> Any:
    """``argv`` by ``func``'s magic_arguments parser; ``--help`` prints its help (None)."""
    parser = func.parser
    if _wants_help(argv):
        print(parser.format_help().replace("::\n\n  %", "usage: %", 1))
        return None
    try:
        check_argparse(parser, argv)  # a misspelt option says which was meant
        return parser.parse_args(argv)
    except (UsageError, OptionError) as exc:
        raise UsageError(f"{exc} (see %{parser.prog} --help)") from None


@magics_class
class GpuMagics(Magics):
    """``%gpu`` (line: subcommands) and ``%%gpu`` (cell: run remotely)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._client: GpuSchedClient | None = None
        self.leases = LeaseKeeper(lambda: self.client, session_name())
        self._said: set[str] = set()
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

    def _say(self, notes: list[str]) -> None:
        """Each note once per kernel (an old spelling, what ``--mem`` means)."""
        for note in notes:
            if note not in self._said:
                self._said.add(note)
                print(f"%gpu: note: {note}", file=sys.stderr)

    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        """Run this cell on a leased GPU (variables persist); ``%gpu COMMAND`` does the rest.

        ``%gpu --help`` lists the options of a %%gpu cell and the line commands: release,
        status, queue, submit, submit-notebook, cancel, logs, leases, config
        (``%gpu COMMAND --help`` for each).
        """
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"cannot read the arguments: {exc}") from None
        if cell is None:
            return self._line(argv)
        if _wants_help(argv):
            print(_PARSERS["cell"].format_help())
            return None
        args, words, after = _grammar("cell", argv)
        if words or after:
            raise UsageError(
                f"%%gpu takes options only, not {' '.join([*words, *after])!r} (see %gpu --help)"
            )
        if args.gpus == 0:
            raise UsageError(
                "--gpus 0: a %%gpu cell needs at least 1 GPU (run CPU-only code without %%gpu)"
            )
        fields, notes = request_fields("cell", vars(args))
        self._say(notes)
        asked = {f: fields[f] for f in _ASKED if f in fields}
        return self.leases.run_cell(
            cell, args.lease or "default", fields, args.timeout, asked=asked
        )

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
            print(f"{_COMMANDS_LINE}\n\n{_PARSERS['cell'].format_help()}")
            return None
        command = commands.get(argv[0])
        if command is None:
            raise UsageError(f"unknown command {argv[0]!r}; use one of {', '.join(commands)}")
        return command(argv[1:])

    # -- line commands ------------------------------------------------------------------------

    @magic_arguments(name="gpu release")
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

    @magic_arguments(name="gpu status")
    def _status(self, argv: list[str]) -> Any:
        """Show the cluster map, live."""
        if _parse(self._status, argv) is None:
            return None
        from .widgets import ClusterMap

        widget = ClusterMap(client=self.client)
        widget.refresh()
        widget.follow()
        return widget

    @magic_arguments(name="gpu queue")
    @argument("--all", action="store_true", help="Include ended jobs.")
    @argument("--limit", type=_count, default=50, help="At most this many jobs.")
    def _queue(self, argv: list[str]) -> None:
        """Jobs queued or running."""
        from jupyter_gpusched.cli.formats import format_queue

        if (args := _parse(self._queue, argv)) is None:
            return
        states = None if args.all else "queued,starting,running"
        page = self.leases.call(self.client.list_jobs, state=states, limit=args.limit)
        print(format_queue(page.jobs, total=page.total))

    def _submit(self, argv: list[str]) -> JobView | None:
        """Queue a script: %gpu submit --gpus 2 train.py [ARGS]; after '--' all is the script's."""
        if _wants_help(argv):
            print(_PARSERS["submit"].format_help())
            return None
        args, words, after = _grammar("submit", argv)
        rest = [*words, *after]
        if not rest:
            raise UsageError("give the script to run, e.g. %gpu submit --gpus 1 train.py")
        script, script_argv = rest[0], rest[1:]
        if not os.path.isfile(script):
            raise UsageError(f"no file {script!r} in {os.getcwd()}")
        try:
            fields, notes = request_fields("submit", vars(args))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self._say(notes)
        run = os.path.basename(script) if args.staged else script
        command = ["python3", run] if script.endswith(".py") else [f"./{run}"]
        spec: dict[str, Any] = {
            "kind": "script",
            "command": [*command, *script_argv],
            "files": [os.path.abspath(script)],
            "name": os.path.basename(script),
            **fields,
        }
        if not args.staged and "workdir" not in spec:
            spec["workdir"] = os.getcwd()
        if args.array is not None:
            jobs = self.leases.call(self.client.submit_array, args.array, spec)
            print(
                f"%gpu: submitted array {jobs.array_id}: {jobs.size} tasks "
                f"{jobs.array_id}_[0-{jobs.size - 1}], each a job once it can start; list "
                f"them with jupyter gpusched queue --array {jobs.array_id}"
            )
            return None
        job: JobView = self.leases.call(self.client.submit, spec)
        print(f"%gpu: submitted job {job.id} ({standing(job)}); follow it with %gpu logs {job.id}")
        return job

    def _submit_notebook(self, argv: list[str]) -> NotebookSubmitted | None:
        """Run a notebook as a batch job: %gpu submit-notebook nb.ipynb -p lr=0.1 --at tonight.

        The executed copy comes back beside it with a timestamped name.
        """
        if _wants_help(argv):
            print(_PARSERS["submit-notebook"].format_help())
            return None
        args, words, after = _grammar("submit-notebook", argv)
        if len(words) + len(after) != 1:
            raise UsageError(
                "give one notebook, e.g. %gpu submit-notebook train.ipynb -p lr=0.1 "
                "(see %gpu submit-notebook --help)"
            )
        (notebook,) = [*words, *after]
        if not os.path.isfile(notebook):
            raise UsageError(f"no notebook {notebook!r} in {os.getcwd()}")
        try:
            fields, notes = request_fields("submit-notebook", vars(args))
            merge_parameters(fields, args.parameters_json)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self._say(notes)
        path = os.path.abspath(notebook)
        answer = self.leases.call(self.client.submit_notebook, path, **fields)
        if answer.definition is not None:
            print(
                f"%gpu: scheduled {notebook} as definition {answer.definition.id} "
                f"({args.at}); list them with 'jupyter gpusched definitions'"
            )
        elif answer.job is not None:
            job = answer.job
            print(
                f"%gpu: submitted {notebook} as job {job.id} ({standing(job)}); "
                f"follow it with %gpu logs {job.id}"
            )
        return answer

    @magic_arguments(name="gpu cancel")
    @argument("ids", nargs="+", type=_count, metavar="ID")
    def _cancel(self, argv: list[str]) -> None:
        """Cancel queued or running jobs."""
        if (args := _parse(self._cancel, argv)) is None:
            return
        for job_id in args.ids:
            job = self.leases.call(self.client.cancel, job_id)
            print(f"%gpu: job {job_id} {job.state.value}")

    @magic_arguments(name="gpu logs")
    @argument("id", type=_count, metavar="ID")
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

    @magic_arguments(name="gpu leases")
    def _leases(self, argv: list[str]) -> None:
        """My live leases."""
        from jupyter_gpusched.cli.formats import format_queue

        if _parse(self._leases, argv) is None:
            return
        print(format_queue(self.leases.call(self.client.leases)))

    @magic_arguments(name="gpu config")
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
