"""A notebook submission: what it asks for, when it runs, and the command that runs it.

``POST notebooks`` bodies are read into a
:class:`~jupyter_gpusched.core.api.NotebookSubmission`; ``at`` (now, tonight, a
window name, an ISO time, or a cron expression for a recurring definition) is resolved with
the policy windows; the job runs ``python -m jupyter_gpusched.node.nbrun`` in its job dir.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from jupyter_gpusched.core import windows
from jupyter_gpusched.core.api import NotebookSubmission, parse_body
from jupyter_gpusched.core.errors import InvalidSpecError, NotFoundError
from jupyter_gpusched.core.models import (
    Job,
    JobSpec,
    parse_spec,
)
from jupyter_gpusched.node.jobs import PARAMETERS_ENV

from .cron import check_schedule, check_timezone

#: Labels a notebook job carries (all strings, as labels are).
CELL_TIMEOUT_LABEL = "notebook_cell_timeout_s"
BACKOFF_LABEL = "notebook_retry_backoff_s"
CWD_LABEL = "notebook_cwd"
#: First wait before a failed run is retried, as the request model says.
DEFAULT_BACKOFF_S: float = NotebookSubmission.model_fields["retry_backoff_s"].default


@dataclass(frozen=True)
class Submission:
    """A checked notebook request: the job spec and, for a recurring one, its schedule."""

    spec: JobSpec
    schedule: str | None = None
    timezone: str = "UTC"
    catch_up: str = "skip"
    paused: bool = False
    name: str | None = None


def parse_request(data: Any) -> NotebookSubmission:
    """Validate a request body, raising :class:`InvalidSpecError` naming the bad field."""
    return parse_body(NotebookSubmission, data, '{"notebook": "nb.ipynb"}')


def resolve_notebook(path: str, root_dir: str) -> tuple[str, str]:
    """``(path as the job shows it, absolute path)`` of an existing notebook.

    A relative path is an API path under ``root_dir``; an absolute one (from the CLI or a
    kernel) must lie under it too: the executed notebook and its log are written beside the
    input, and they belong in the owner's area, nowhere else. The job shows it root-relative.
    """
    root = os.path.realpath(root_dir)
    full = os.path.realpath(path if os.path.isabs(path) else os.path.join(root, path))
    if os.path.commonpath([full, root]) != root:
        raise InvalidSpecError(
            "notebook",
            f"{path!r} is outside your root directory {root}, where the executed notebook "
            "is written; move it there (or give a path under it)",
        )
    if not full.endswith(".ipynb"):
        raise InvalidSpecError("notebook", f"{path!r} is not a notebook (.ipynb)")
    if not os.path.isfile(full):
        raise NotFoundError(
            f"notebook {path!r} not found (relative paths start at the server's root directory)"
        )
    return os.path.relpath(full, root).replace(os.sep, "/"), full


def is_cron(text: str) -> bool:
    """Whether ``at`` reads as a cron expression (5 fields or an @-macro)."""
    text = text.strip()
    return text.startswith("@") or len(text.split()) == 5


def next_batch_window(config: windows.PolicyConfig, now: datetime) -> datetime:
    """When "tonight" begins: now, or the next start of a window without a batch time limit.

    A window "admits batch work" when batch jobs started in it have no runtime limit and it
    does not reserve every GPU for interactive work (the default policy: ``night``).
    """
    t = now
    for _ in range(64):  # windows repeat weekly: a few dozen boundaries cover every case
        active = windows.resolve_window(config, t)
        w = active.window
        if w.batch_max_runtime_s is None and w.interactive_reserved_share < 1.0:
            return t
        if active.until is None:
            break
        t = active.until
    raise InvalidSpecError(
        "at",
        "no policy window lets batch jobs run without a time limit; "
        "give a time (ISO) or a cron expression instead of 'tonight'",
    )


def next_window(config: windows.PolicyConfig, now: datetime, name: str) -> datetime:
    """Now if window ``name`` is in force, else the start of its next occurrence."""
    t = now
    for _ in range(64):
        active = windows.resolve_window(config, t)
        if active.window.name.lower() == name.lower():
            return t
        if active.until is None:
            break
        t = active.until
    raise InvalidSpecError("at", f"window {name!r} never comes")


def resolve_at(
    at: str, config: windows.PolicyConfig, now: datetime, tz_name: str | None = None
) -> tuple[datetime | None, str | None]:
    """``(not_before, schedule)`` for ``at``: a start time (None = now) or a cron schedule."""
    text = at.strip()
    word = text.lower()
    names = {w.name.lower() for w in config.windows}
    if word in ("", "now"):
        return None, None
    if word in names and word not in ("tonight",):
        start = next_window(config, now, word)
    elif word in ("tonight", "night"):
        start = next_batch_window(config, now)
    elif is_cron(text):
        check_schedule(text, tz_name or config.timezone)
        return None, text
    else:
        try:
            start = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidSpecError(
                "at",
                f"{at!r} is not 'now', 'tonight', a window name ({', '.join(sorted(names))}"
                "), an ISO time or a cron expression like '0 2 * * *'",
            ) from None
        if start.tzinfo is None:
            start = start.replace(tzinfo=ZoneInfo(tz_name or config.timezone))
    return (None if start <= now else start), None


def script_start(
    at: Any, tz_name: Any, config: windows.PolicyConfig, now: datetime
) -> datetime | None:
    """``not_before`` of a script job given ``at`` (and its ``timezone``), as notebooks read it.

    ``POST jobs`` takes the words ``POST notebooks`` takes (now, tonight, a window, an ISO
    time), so ``--at tonight`` means the same for a script and a notebook; a cron expression
    repeats notebooks only.
    """
    if not isinstance(at, str):
        raise InvalidSpecError("at", "give now, tonight, a window name or an ISO time as text")
    if tz_name is not None and not isinstance(tz_name, str):
        raise InvalidSpecError("timezone", "give an IANA name like 'Europe/Berlin'")
    tz = tz_name or config.timezone
    check_timezone(tz)
    if is_cron(at):
        raise InvalidSpecError(
            "at",
            "a cron expression repeats notebooks only (submit-notebook); for a script give "
            "now, tonight, a window name or an ISO time",
        )
    return resolve_at(at, config, now, tz)[0]


def build_submission(
    request: NotebookSubmission,
    *,
    user: str,
    root_dir: str,
    config: windows.PolicyConfig,
    now: datetime,
    recurring: bool | None = None,
) -> Submission:
    """Check a notebook request and turn it into a job spec (and schedule, when recurring).

    ``recurring=True`` needs ``schedule`` (or a cron ``at``); ``False`` refuses a cron.
    """
    for key in request.parameters:
        if not isinstance(key, str) or not key.isidentifier():
            raise InvalidSpecError(f"parameters.{key}", "must be a valid variable name")
    tz_name = request.timezone or config.timezone
    check_timezone(tz_name)
    schedule = request.schedule
    not_before = None
    if schedule is None:
        not_before, schedule = resolve_at(request.at, config, now, tz_name)
    else:
        check_schedule(schedule, tz_name)
    if recurring is True and schedule is None:
        raise InvalidSpecError("schedule", "a definition needs a cron schedule like '0 2 * * *'")
    if recurring is False and schedule is not None:
        raise InvalidSpecError(
            "at", "a cron expression makes a recurring definition; POST it to definitions"
        )
    rel, full = resolve_notebook(request.notebook, root_dir)
    labels = dict(request.labels)
    if request.cell_timeout_s is not None:
        labels[CELL_TIMEOUT_LABEL] = f"{request.cell_timeout_s:g}"
    if request.retries:
        labels[BACKOFF_LABEL] = f"{request.retry_backoff_s:g}"
    if request.cwd:
        labels[CWD_LABEL] = request.cwd
    fields = request.model_dump(
        exclude={
            "notebook",
            "at",
            "schedule",
            "timezone",
            "catch_up",
            "paused",
            "cell_timeout_s",
            "retry_backoff_s",
            "cwd",
            "labels",
        },
        exclude_none=True,
    )
    spec = parse_spec(
        {
            **fields,
            "kind": "notebook",
            "notebook": rel,
            "files": [full],
            "labels": labels,
            "name": request.name or posixpath.basename(rel),
            "not_before": not_before,
        },
        bounds=config.spec_bounds(now),
        user=user,
    )
    return Submission(spec, schedule, tz_name, request.catch_up, request.paused, request.name)


# ------------------------------------------------------------------------------ the command


def remote_output_name(spec: JobSpec) -> str:
    """Name of the executed notebook in the job directory on the node."""
    stem = posixpath.splitext(posixpath.basename(spec.notebook or "notebook"))[0]
    return f"{stem}.gpusched-out.ipynb"


def staged_notebook(spec: JobSpec) -> str | None:
    """The local file staged as the input notebook, when there is one."""
    name = posixpath.basename(spec.notebook or "")
    return next((f for f in spec.files if os.path.basename(f) == name), None)


def notebook_command(job: Job, *, python: str = "python3") -> list[str]:
    """Argv that runs ``job``'s notebook through nbrun, in the job directory on the node.

    Its parameters are not in it: every user of a node reads command lines (``ps``). The
    backend hands them to the job as a private file, ``$GPUSCHED_PARAMETERS_FILE``, which
    nbrun reads (``--parameters-env``).
    """
    spec = job.spec
    assert spec.notebook is not None
    staged = staged_notebook(spec)
    argv = [
        python,
        "-m",
        "jupyter_gpusched.node.nbrun",
        posixpath.basename(spec.notebook) if staged else spec.notebook,
        "--output",
        remote_output_name(spec),
    ]
    if staged:
        # nodes that share the server's filesystem get no staged copy, but see this path
        argv += ["--fallback-input", staged]
    if spec.parameters:
        # their name, not their values: a node too old to hand them over fails the job loudly
        argv += ["--parameters-env", PARAMETERS_ENV]
    if spec.kernel_name:
        argv += ["--kernel", spec.kernel_name]
    if CELL_TIMEOUT_LABEL in spec.labels:
        argv += ["--cell-timeout-s", spec.labels[CELL_TIMEOUT_LABEL]]
    if CWD_LABEL in spec.labels:
        argv += ["--cwd", spec.labels[CWD_LABEL]]
    limit_s = job.handle.get("limit_s")
    if limit_s:
        # stop a little before the scheduler's kill, so the notebook is saved with a reason
        margin_s = min(5.0, 0.05 * float(limit_s))
        argv += ["--job-timeout-s", f"{max(1.0, float(limit_s) - margin_s):g}"]
    return argv
