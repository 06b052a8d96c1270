"""``jupyter gpusched submit|queue|cancel|logs|nodes``: the REST API from a terminal.

Each subcommand finds the running server (``--url``/``--token``, ``$GPUSCHED_URL``, or the
running-server files ``jupyter server list`` reads). Exit codes: 0 ok, 1 the server refused or
could not be reached (one line on stderr says why), 2 bad arguments.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar

from traitlets import Bool, Unicode

from jupyter_gpusched.client.options import (
    QUEUE_LIMIT,
    QUEUE_OPTIONS,
    QUEUE_STATES,
    missing_script,
    request_fields,
)
from jupyter_gpusched.core.api import MAX_ARRAY_TASKS, MAX_LIMIT

from .base import (
    Count,
    GpuSchedCommand,
    UsageError,
    option_aliases,
    option_flags,
    option_trait,
    task_ids,
)


class JobOptions(GpuSchedCommand):
    """What every job asks for (the grammar's options, :mod:`jupyter_gpusched.client.options`).

    Subclasses name their ``grammar`` command and add the options only they take.
    """

    #: The command of the grammar whose options this app takes.
    grammar: ClassVar[str] = ""

    gpus = option_trait("--gpus")
    gpu_mem = option_trait("--gpu-mem")
    share = option_trait("--share")
    model = option_trait("--model")
    cpus = option_trait("--cpus")
    mem = option_trait("--mem")
    host_mem = option_trait("--host-mem")
    max_runtime = option_trait("--max-runtime")
    job_name = option_trait("--name")
    priority = option_trait("--priority")
    retries = option_trait("--retries")
    env = option_trait("--env")
    at = option_trait("--at")
    timezone = option_trait("--timezone")
    json = Bool(False, help="Print the API's JSON.").tag(config=True)

    def request(self) -> dict[str, Any]:
        """The request fields of the options given (the server's defaults for the rest).

        Raises :class:`UsageError` for a value the grammar refuses (``--env X``); the notes
        (an old spelling, what ``--mem`` means) are kept to say when the command runs.
        """
        values = {name: getattr(self, name) for name in self.trait_names(config=True)}
        try:
            fields, self.notes = request_fields(self.grammar, values)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return fields

    def say_notes(self) -> None:
        """The notes of :meth:`request`, one line each on stderr."""
        for note in getattr(self, "notes", ()):
            print(f"{self.prog}: note: {note}", file=sys.stderr)


def _json_flag(cls: str) -> dict[str, Any]:
    return {"json": ({cls: {"json": True}}, "Print the API's JSON.")}


class SubmitApp(JobOptions):
    """Queue a script: ``jupyter gpusched submit --gpus 2 --gpu-mem 16G -- python train.py``.

    Like ``%gpu submit``: local files the command names (relative paths, e.g. ``train.py``)
    are staged with the job, and it runs in this directory (for nodes that share it), or in
    its job directory on the node with ``--staged``.
    """

    command = "submit"
    grammar = "submit"
    description = (
        "Queue a script on the GPU cluster: options first, then the command to run (after "
        "'--' when it has options of its own). Files it names (relative paths) are staged; it "
        "runs in this directory, or with --staged in the job's directory on the node."
    )
    examples = "jupyter gpusched submit --gpus 2 --gpu-mem 16G -- python train.py --lr 0.1"

    workdir = option_trait("--workdir")
    staged = option_trait("--staged")
    array = option_trait("--array")

    aliases = {**GpuSchedCommand.aliases, **option_aliases("submit", "SubmitApp")}
    flags = {
        **GpuSchedCommand.flags,
        **_json_flag("SubmitApp"),
        **option_flags("submit", "SubmitApp"),
    }

    def check(self) -> None:
        """The command, the script it runs, the working directory and the environment."""
        if not self.extra_args:
            raise UsageError("give the command to run after --, e.g. -- python train.py")
        fields = self.request()
        argv = list(self.extra_args)
        if argv[0].endswith(".py") and "/" not in argv[0]:
            argv.insert(0, "python3")  # as %gpu submit train.py runs it
        if self.workdir is None and (missing := missing_script(argv, os.getcwd())):
            raise UsageError(missing)
        command, self.staged_files = staged_command(argv, staged=self.staged)
        self.spec = {"kind": "script", "command": command, **fields}
        workdir = self.workdir or (None if self.staged else os.getcwd())
        files = [os.path.abspath(f) for f in self.staged_files] or None
        extra = {"workdir": workdir, "files": files}
        self.spec.update({k: v for k, v in extra.items() if v is not None})
        if self.array is not None and not 1 <= self.array <= MAX_ARRAY_TASKS:
            raise UsageError(f"--array: from 1 to {MAX_ARRAY_TASKS} tasks, got {self.array}")

    def run(self) -> int:
        """Submit; say which job (or array of jobs) it became, where it stands, what was staged."""
        from jupyter_gpusched.core.figures import eta_label, position_label

        from .formats import local_tz

        self.say_notes()
        if self.array is not None:
            jobs = self.client().submit_array(self.array, self.spec)
            if self.json:
                print(jobs.model_dump_json(indent=2))
            else:
                print(
                    f"submitted array {jobs.array_id}: {jobs.size} tasks "
                    f"{jobs.array_id}_[0-{jobs.size - 1}] (queued; each becomes a job as it can "
                    f"start); follow one: jupyter gpusched logs {jobs.array_id}_0 -f"
                )
            return 0
        job = self.client().submit(self.spec)
        if self.json:
            print(job.model_dump_json(indent=2))
            return 0
        where = [job.state.value]
        if job.position:
            where.append(position_label(job.position))
        if job.estimated_start is not None:
            now = datetime.now(UTC)
            where.append(f"starts {eta_label(job.estimated_start, now, local_tz())}")
        print(
            f"submitted job {job.id} ({', '.join(where)}); follow it: jupyter gpusched logs "
            f"{job.id} -f"
        )
        if self.staged_files:
            runs = "in its job directory" if self.staged else f"in {self.spec['workdir']}"
            print(f"staged {', '.join(self.staged_files)}; it runs {runs}")
        return 0


def staged_command(argv: list[str], *, staged: bool) -> tuple[list[str], list[str]]:
    """The command to run and the local files it names (relative paths to files here).

    With ``staged`` the command names the staged copies, which land in the job's directory
    under their base names.
    """
    files = [a for a in argv if not os.path.isabs(a) and os.path.isfile(a)]
    if not staged:
        return argv, files
    out = []
    for i, arg in enumerate(argv):
        if arg in files:
            arg = os.path.basename(arg)
            arg = f"./{arg}" if i == 0 else arg  # a program runs from its directory
        out.append(arg)
    return out, files


class QueueApp(GpuSchedCommand):
    """Show the queue: queued and running jobs (``--all`` for finished too)."""

    command = "queue"
    description = "Show the queue: queued and running jobs (--all for finished too)."

    all = Bool(False, help=QUEUE_OPTIONS["--all"].help).tag(config=True)
    state = Unicode(None, allow_none=True, help=QUEUE_OPTIONS["--state"].help).tag(config=True)
    user = Unicode(None, allow_none=True, help=QUEUE_OPTIONS["--user"].help).tag(config=True)
    limit = Count(QUEUE_LIMIT, help=QUEUE_OPTIONS["--limit"].help).tag(config=True)
    array = Count(None, allow_none=True, help=QUEUE_OPTIONS["--array"].help).tag(config=True)
    json = Bool(False, help=QUEUE_OPTIONS["--json"].help).tag(config=True)

    # the quick path (cli/quick.py) reads the same table: a word is ours in both or in neither
    aliases = {
        **GpuSchedCommand.aliases,
        **{o.word: f"QueueApp.{o.name}" for o in QUEUE_OPTIONS.values() if o.kind != "flag"},
    }
    flags = {
        **GpuSchedCommand.flags,
        **{
            o.word: ({"QueueApp": {o.name: True}}, o.help)
            for o in QUEUE_OPTIONS.values()
            if o.kind == "flag"
        },
    }

    def check(self) -> None:  # noqa: D102
        self.positional("", at_most=0)

    def run(self) -> int:
        """Print the table (or the API's JSON)."""
        from .formats import format_queue

        state = self.state or (None if self.all else QUEUE_STATES)
        page = self.client().list_jobs(
            state=state, user=self.user, array=self.array, limit=self.limit
        )
        print(
            page.model_dump_json(indent=2)
            if self.json
            else format_queue(page.jobs, total=page.total, arrays=page.arrays)
        )
        return 0


class CancelApp(GpuSchedCommand):
    """``cancel ID...``: cancel queued or running jobs (``ID_7``: a task; ``--array ID``)."""

    command = "cancel"
    description = (
        "Cancel queued or running jobs: jupyter gpusched cancel ID [ID ...] (ID_7: task 7 of "
        "array ID), or a whole array: jupyter gpusched cancel --array ID."
    )

    array = Count(None, allow_none=True, help="Cancel every task of this array.").tag(config=True)
    aliases = {**GpuSchedCommand.aliases, "array": "CancelApp.array"}

    def check(self) -> None:  # noqa: D102
        self.ids = task_ids(self.positional("ID", at_least=0 if self.array is not None else 1))

    def run(self) -> int:
        """Cancel each job or task in turn; stop at the first refusal."""
        from jupyter_gpusched.client.api import ApiError

        client = self.client()
        ids = list(self.ids)
        if self.array is not None:
            try:
                done = client.cancel_array(self.array)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                ids.extend(self._list_bulk(client))  # a list's jobs: no array record
            else:
                print(
                    f"array {self.array}: {done.pending} pending tasks cancelled, "
                    f"{len(done.jobs)} jobs cancelled"
                )
        for job_id in ids:
            if isinstance(job_id, tuple):
                task = client.cancel_array_task(*job_id)
                print(task.detail)
                continue
            job = client.cancel(job_id)
            print(f"job {job.id} {job.state.value}")
        return 0

    def _list_bulk(self, client: Any) -> list[int]:
        """The live jobs of a list submitted in bulk (its ``array_id``)."""
        live = "queued,starting,running,preempted,lost"
        ids: list[int] = []
        page = client.list_jobs(state=live, array=self.array, limit=MAX_LIMIT)
        while page.jobs:
            ids.extend(j.id for j in page.jobs)
            if len(ids) >= page.total:
                break
            page = client.list_jobs(state=live, array=self.array, limit=MAX_LIMIT, offset=len(ids))
        if not ids:
            print(f"array {self.array}: no live jobs")
        return ids


class LogsApp(GpuSchedCommand):
    """``logs ID [-f]``: print a job's output."""

    command = "logs"
    description = (
        "Print a job's combined stdout and stderr: jupyter gpusched logs ID [-f] (a notebook "
        "job's progress lines left out)."
    )

    follow = Bool(False, help="Keep printing until the job ends.").tag(config=True)
    offset = Count(0, help="Start at this byte.").tag(config=True)

    aliases = {**GpuSchedCommand.aliases, "offset": "LogsApp.offset"}
    flags = {
        **GpuSchedCommand.flags,
        ("f", "follow"): ({"LogsApp": {"follow": True}}, "Keep printing until the job ends."),
    }

    def check(self) -> None:  # noqa: D102
        (self.job_id,) = task_ids(self.positional("ID", at_least=1, at_most=1))

    def run(self) -> int:
        """Copy the log to stdout, as bytes, without a notebook job's progress lines."""
        from jupyter_gpusched.core.progress import ProgressFilter

        client = self.client()
        if isinstance(self.job_id, tuple):  # an array's task: its job, once it was made
            task = client.array_task(*self.job_id)
            if task.job is None:
                print(f"{self.prog}: {task.detail}", file=sys.stderr)
                return 1
            self.job_id = task.job.id
        out = sys.stdout.buffer
        shown = ProgressFilter()
        if self.follow:
            for chunk in client.follow_log(self.job_id, offset=self.offset):
                out.write(shown.feed(chunk))
                out.flush()
        else:
            offset = self.offset
            while True:
                data, offset = client.read_log(self.job_id, offset=offset, limit=1 << 20)
                out.write(shown.feed(data))
                if len(data) < 1 << 20:
                    break
        out.write(shown.close())
        out.flush()
        return 0


class NodesApp(GpuSchedCommand):
    """``nodes``: a text map of the cluster, one line per node, one glyph per GPU."""

    command = "nodes"
    description = "Show the cluster: one line per node, one glyph per GPU."

    json = Bool(False, help="Print the API's JSON.").tag(config=True)
    flags = {**GpuSchedCommand.flags, **_json_flag("NodesApp")}

    def check(self) -> None:  # noqa: D102
        self.positional("", at_most=0)

    def run(self) -> int:
        """Print the map (or the API's JSON)."""
        from .formats import format_cluster

        cluster = self.client().cluster()
        print(cluster.model_dump_json(indent=2) if self.json else format_cluster(cluster))
        return 0
