"""``jupyter gpusched submit-notebook|definitions``: notebook jobs and schedules from a terminal.

Exit codes as the other subcommands: 0 ok, 1 refused or unreachable, 2 bad arguments.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from traitlets import Bool, Unicode

from jupyter_gpusched.client.options import merge_parameters

from .base import GpuSchedCommand, UsageError, job_ids, option_aliases, option_flags, option_trait
from .jobs import JobOptions, _json_flag

if TYPE_CHECKING:
    from jupyter_gpusched.client.api import GpuSchedClient
    from jupyter_gpusched.core.api import JobView


class SubmitNotebookApp(JobOptions):
    """``submit-notebook NB [-p NAME=VALUE ...] [--gpus N] [--at WHEN]``."""

    command = "submit-notebook"
    grammar = "submit-notebook"
    description = (
        "Run a notebook on the GPU cluster as a batch job; the executed notebook comes back "
        "beside it."
    )
    examples = "jupyter gpusched submit-notebook train.ipynb -p lr=0.1 --gpus 2 --at tonight"

    parameter = option_trait("--parameter")
    parameters_json = option_trait("--parameters-json")
    kernel = option_trait("--kernel")
    catch_up = option_trait("--catch-up")
    cell_timeout = option_trait("--cell-timeout")
    retry_backoff = option_trait("--retry-backoff")
    wait = Bool(False, help="Wait for the run; exit 1 if it failed.").tag(config=True)

    aliases = {
        **GpuSchedCommand.aliases,
        **option_aliases("submit-notebook", "SubmitNotebookApp"),
    }
    flags = {
        **GpuSchedCommand.flags,
        **_json_flag("SubmitNotebookApp"),
        **option_flags("submit-notebook", "SubmitNotebookApp"),
        "wait": ({"SubmitNotebookApp": {"wait": True}}, "Wait for the run; exit 1 if it failed."),
    }

    def check(self) -> None:
        """The notebook (a file here) and its parameters."""
        (self.notebook,) = self.positional("notebook", at_least=1, at_most=1)
        if not os.path.isfile(self.notebook):
            raise UsageError(f"no notebook {self.notebook!r} in {os.getcwd()}")
        self.fields = self.request()
        try:
            merge_parameters(self.fields, self.parameters_json)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def run(self) -> int:
        """Submit; say which job or definition it became (wait for the job with --wait)."""
        from .formats import format_definition, format_notebook_job

        self.say_notes()
        client = self.client()
        answer = client.submit_notebook(os.path.abspath(self.notebook), **self.fields)
        job, definition = answer.job, answer.definition
        if job is not None and self.wait:
            job = wait_for_output(client, job.id)
        if self.json:
            print((job or definition).model_dump_json(indent=2))  # type: ignore[union-attr]
        elif job is not None:
            print(format_notebook_job(job))
        elif definition is not None:
            print(format_definition(definition))
        return 0 if job is None or not self.wait or job.state == "succeeded" else 1


def wait_for_output(client: GpuSchedClient, job_id: int, timeout_s: float = 3600.0) -> JobView:
    """The job once ended and its executed notebook is back (or a few seconds after)."""
    import time

    job = client.wait(job_id, timeout_s=timeout_s)
    deadline = time.monotonic() + 30.0
    while (job.outputs is None or not job.outputs.notebook) and time.monotonic() < deadline:
        time.sleep(0.3)
        job = client.get_job(job_id)
    return job


class DefinitionsApp(GpuSchedCommand):
    """``definitions [list|show|pause|resume|delete] [ID ...]``."""

    command = "definitions"
    description = "List, show, pause, resume or delete recurring notebook jobs."
    examples = "jupyter gpusched definitions pause 3"

    user = Unicode(None, allow_none=True, help="List only this user's ('me' for yours).").tag(
        config=True
    )
    json = Bool(False, help="Print the API's JSON.").tag(config=True)

    aliases = {**GpuSchedCommand.aliases, "user": "DefinitionsApp.user"}
    flags = {**GpuSchedCommand.flags, **_json_flag("DefinitionsApp")}
    verbs = ("list", "show", "pause", "resume", "delete")

    def check(self) -> None:
        """A verb, and ids for all but ``list``."""
        args = self.positional("verb")
        self.verb = args[0] if args else "list"
        if self.verb not in self.verbs:
            raise UsageError(f"argument verb: {self.verb!r} is not one of {', '.join(self.verbs)}")
        self.ids = job_ids(args[1:])
        if self.verb != "list" and not self.ids:
            raise UsageError(f"{self.verb} needs at least one definition ID")

    def run(self) -> int:
        """List, or act on each id in turn."""
        from .formats import format_definition

        client = self.client()
        if self.verb == "list":
            page = client.list_definitions(user=self.user)
            if self.json:
                print(page.model_dump_json(indent=2))
            else:
                print("\n".join(format_definition(d) for d in page.definitions) or "no definitions")
            return 0
        for def_id in self.ids:
            if self.verb == "show":
                d = client.get_definition(def_id)
            elif self.verb == "delete":
                d = client.delete_definition(def_id)
            else:
                d = client.update_definition(def_id, paused=self.verb == "pause")
            if self.json:
                print(d.model_dump_json(indent=2))
                continue
            print(("deleted " if self.verb == "delete" else "") + format_definition(d))
            if self.verb == "show":
                for run in d.runs:
                    late = " (caught up)" if run.caught_up else ""
                    print(f"  {run.fire_at.isoformat()}: job {run.job_id}{late}")
        return 0
