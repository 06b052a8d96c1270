"""``jupyter gpusched submit-notebook|definitions``: notebook jobs and schedules from a terminal.

Exit codes as the other subcommands: 0 ok, 1 refused or unreachable, 2 bad arguments.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from traitlets import Bool, Enum, List, Unicode

from jupyter_gpusched.client.options import HELP, parse_parameter

from .base import Duration, GpuSchedCommand, UsageError, job_ids
from .jobs import ResourceOptions, _json_flag, _resource_aliases

if TYPE_CHECKING:
    from jupyter_gpusched.client.api import GpuSchedClient
    from jupyter_gpusched.core.api import JobView


class SubmitNotebookApp(ResourceOptions):
    """``submit-notebook NB [-p NAME=VALUE ...] [--gpus N] [--at WHEN]``."""

    command = "submit-notebook"
    description = (
        "Run a notebook on the GPU cluster as a batch job; the executed notebook comes back "
        "beside it."
    )
    examples = "jupyter gpusched submit-notebook train.ipynb -p lr=0.1 --gpus 2 --at tonight"

    parameter = List(Unicode(), help=HELP["parameter"]).tag(config=True)
    parameters_json = Unicode(None, allow_none=True, help="All parameters as one JSON object.").tag(
        config=True
    )
    at = Unicode("now", help=HELP["at"]).tag(config=True)
    kernel = Unicode(None, allow_none=True, help=HELP["kernel"]).tag(config=True)
    timezone = Unicode(
        None, allow_none=True, help="Timezone of the cron (default: the policy's)."
    ).tag(config=True)
    catch_up = Enum(
        ("skip", "once"), None, allow_none=True, help="After downtime (cron only): skip or once."
    ).tag(config=True)
    cell_timeout = Duration(
        None, allow_none=True, help="Stop a cell after this long, e.g. 10m."
    ).tag(config=True)
    retry_backoff = Duration(None, allow_none=True, help="First wait before a retry (1m).").tag(
        config=True
    )
    wait = Bool(False, help="Wait for the run; exit 1 if it failed.").tag(config=True)

    aliases = {
        **GpuSchedCommand.aliases,
        **_resource_aliases("SubmitNotebookApp"),
        ("p", "parameter"): "SubmitNotebookApp.parameter",
        "parameters-json": "SubmitNotebookApp.parameters_json",
        "at": "SubmitNotebookApp.at",
        "kernel": "SubmitNotebookApp.kernel",
        "timezone": "SubmitNotebookApp.timezone",
        "catch-up": "SubmitNotebookApp.catch_up",
        "cell-timeout": "SubmitNotebookApp.cell_timeout",
        "retry-backoff": "SubmitNotebookApp.retry_backoff",
    }
    flags = {
        **GpuSchedCommand.flags,
        **_json_flag("SubmitNotebookApp"),
        "wait": ({"SubmitNotebookApp": {"wait": True}}, "Wait for the run; exit 1 if it failed."),
    }

    def check(self) -> None:
        """The notebook and its parameters."""
        (self.notebook,) = self.positional("notebook", at_least=1, at_most=1)
        try:
            parameters = dict(parse_parameter(t) for t in self.parameter)
            if self.parameters_json:
                extra = json.loads(self.parameters_json)
                if not isinstance(extra, dict):
                    raise ValueError("--parameters-json must be a JSON object")
                parameters = {**extra, **parameters}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        extra = {
            "timezone": self.timezone,
            "catch_up": self.catch_up,
            "kernel_name": self.kernel,
            "cell_timeout_s": self.cell_timeout,
            "retry_backoff_s": self.retry_backoff,
        }
        self.fields = {
            "parameters": parameters,
            "at": self.at,
            **self.resources(),
            **{k: v for k, v in extra.items() if v is not None},
        }

    def run(self) -> int:
        """Submit; say which job or definition it became (wait for the job with --wait)."""
        from .formats import format_definition, format_notebook_job

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
