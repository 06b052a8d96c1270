"""Notebook jobs: submit a notebook with parameters, run it on a node, get it back executed.

A plugin of the server extension (``install(scheduler, backend)`` + ``handlers``):

* **command** -- a notebook job runs ``python -m jupyter_gpusched.node.nbrun NB --output OUT ...``
  (:mod:`jupyter_gpusched.node.nbrun`) in its job directory, where the SSH backend staged the input
  notebook (``spec.files``) by SFTP.
* **progress** -- nbrun prints ``##gpusched-progress {...}`` lines; a follower per running
  notebook job reads the log (``backend.follow_log``) and stores each as a ``progress`` event
  (``{"cell", "of", "index", "source", "offset"}``), so websocket subscribers see them.
* **results** -- when the job ends (succeeded, failed, cancelled) the executed notebook and the
  log are fetched (``backend.get_file``) beside the input as ``<stem>-<UTC start>-job<id>.ipynb``
  and ``.log``; the job's labels ``output_notebook`` / ``output_log`` name them.
* **retries** -- a failed notebook job with ``retries`` is submitted again after
  ``retry_backoff_s * 2**n`` (a new job labelled ``retry_of``/``retry``).
* **when** -- ``now``, ``tonight`` (the next window that lets batch work run without a runtime
  limit), a window name, an ISO time, or a cron expression (a recurring definition, see
  :mod:`jupyter_gpusched.batch.definitions`), fired from the scheduler's tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import tempfile
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import ForeignKey, Integer, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from jupyter_gpusched.core import windows
from jupyter_gpusched.core.errors import GpuSchedError, InvalidSpecError, NotFoundError
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    Job,
    JobKind,
    JobSpec,
    JobState,
    PriorityClass,
    parse_spec,
)
from jupyter_gpusched.node.nbrun import parse_progress
from jupyter_gpusched.store.orm import Base, EventRow
from jupyter_gpusched.store.rows import add_event_row

from .definitions import Definitions, check_schedule, check_timezone

log = logging.getLogger(__name__)

#: Labels a notebook job carries (all strings, as labels are).
CELL_TIMEOUT_LABEL = "notebook_cell_timeout_s"
BACKOFF_LABEL = "notebook_retry_backoff_s"
CWD_LABEL = "notebook_cwd"
OUTPUT_LABEL, LOG_LABEL = "output_notebook", "output_log"
#: Largest parameters object, as JSON: it travels on the node's command line.
MAX_PARAMETERS_BYTES = 64 * 1024
DEFAULT_BACKOFF_S = 60.0


class ProgressRow(Base):
    """How far a notebook job's log has been turned into progress events.

    Every server sharing the store may follow the same log; a line becomes an event only in
    the transaction that moves ``log_offset`` past it (compare-and-swap), so each progress
    line is stored once and in order.
    """

    __tablename__ = "notebook_progress"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    log_offset: Mapped[int] = mapped_column(Integer)  # bytes of the log already read
    updated_at: Mapped[datetime]


# ------------------------------------------------------------------------------ requests


class NotebookRequest(BaseModel):
    """What ``POST notebooks`` takes (and ``POST definitions``, with ``schedule``)."""

    model_config = ConfigDict(extra="forbid")

    notebook: str = Field(description="path under the server root (or absolute inside it)")
    parameters: dict[str, Any] = Field(default_factory=dict)
    kernel_name: str | None = None
    at: str = Field("now", description="now | tonight | a window name | ISO time | cron")
    schedule: str | None = Field(None, description="cron expression (definitions only)")
    timezone: str | None = Field(None, description="of the cron / a naive ISO time")
    catch_up: str = Field("skip", description="after downtime: skip | once")
    paused: bool = False
    cell_timeout_s: float | None = Field(None, gt=0)
    retry_backoff_s: float = Field(DEFAULT_BACKOFF_S, ge=0)
    cwd: str | None = Field(None, description="working directory of the kernel on the node")
    name: str | None = Field(None, max_length=200)
    gpus: int = 1
    gpu_mem_gb: float | None = None
    gpu_share: float | None = None
    cpus: float = 1.0
    mem_gb: float = 4.0
    gpu_models: list[str] = Field(default_factory=list)
    priority: PriorityClass | None = None
    max_runtime_s: float | None = None
    env: dict[str, str] = Field(default_factory=dict)
    retries: int = 0
    labels: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class Submission:
    """A checked notebook request: the job spec and, for a recurring one, its schedule."""

    spec: JobSpec
    schedule: str | None = None
    timezone: str = "UTC"
    catch_up: str = "skip"
    paused: bool = False
    name: str | None = None


def parse_request(data: Any) -> NotebookRequest:
    """Validate a request body, raising :class:`InvalidSpecError` naming the bad field."""
    if not isinstance(data, dict):
        raise InvalidSpecError("body", 'must be a JSON object like {"notebook": "nb.ipynb"}')
    try:
        return NotebookRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise InvalidSpecError(field, msg[0].lower() + msg[1:]) from None


def resolve_notebook(path: str, root_dir: str) -> tuple[str, str]:
    """``(path as the job shows it, absolute path)`` of an existing notebook.

    A relative path is an API path under ``root_dir`` and may not leave it; the job shows it
    relative to the root. An absolute path (from the CLI or a kernel) is taken as it is --
    whoever may use this API runs code as the server's user anyway -- and shown relative to
    the root when it lies under it, else absolute.
    """
    root = os.path.realpath(root_dir)
    full = os.path.realpath(path if os.path.isabs(path) else os.path.join(root, path))
    inside = os.path.commonpath([full, root]) == root
    if not os.path.isabs(path) and not inside:
        raise InvalidSpecError(
            "notebook",
            f"{path!r} leads outside the server's root "
            "directory; give a path under it, or an absolute path",
        )
    if not full.endswith(".ipynb"):
        raise InvalidSpecError("notebook", f"{path!r} is not a notebook (.ipynb)")
    if not os.path.isfile(full):
        raise NotFoundError(
            f"notebook {path!r} not found (relative paths start at the server's root directory)"
        )
    shown = os.path.relpath(full, root).replace(os.sep, "/") if inside else full
    return shown, full


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


def build_submission(
    request: NotebookRequest,
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
    if len(json.dumps(request.parameters)) > MAX_PARAMETERS_BYTES:
        raise InvalidSpecError(
            "parameters",
            f"larger than {MAX_PARAMETERS_BYTES} bytes as JSON; pass a path to a data file instead",
        )
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
        user=user,
    )
    return Submission(spec, schedule, tz_name, request.catch_up, request.paused, request.name)


# ------------------------------------------------------------------------------ the command


def remote_output_name(spec: JobSpec) -> str:
    """Name of the executed notebook in the job directory on the node."""
    stem = posixpath.splitext(posixpath.basename(spec.notebook or "notebook"))[0]
    return f"{stem}.gpusched-out.ipynb"


def _staged(spec: JobSpec) -> str | None:
    """The local file staged as the input notebook, when there is one."""
    name = posixpath.basename(spec.notebook or "")
    return next((f for f in spec.files if os.path.basename(f) == name), None)


def notebook_command(job: Job, *, python: str = "python3") -> list[str]:
    """Argv that runs ``job``'s notebook through nbrun, in the job directory on the node."""
    spec = job.spec
    assert spec.notebook is not None
    staged = _staged(spec)
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
        argv += ["--parameters", json.dumps(spec.parameters)]
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


def _node_python(backend: Any, node: str | None) -> str:
    """The interpreter configured for a node (NodeConfig.python), ``python3`` if unknown."""
    return str(backend.node_config(node).python) if node else "python3"


# ------------------------------------------------------------------------------ the plugin


_PLUGINS: weakref.WeakKeyDictionary[Any, NotebookPlugin] = weakref.WeakKeyDictionary()


def plugin_for(scheduler: Any) -> NotebookPlugin:
    """The notebook plugin installed on ``scheduler``."""
    try:
        return _PLUGINS[scheduler]
    except (KeyError, TypeError):
        raise NotFoundError("notebook jobs are not enabled on this server") from None


class NotebookPlugin:
    """Command, end hook, progress followers and definition firing for one scheduler."""

    def __init__(self, scheduler: Any, backend: Any, *, misfire_grace_s: float = 60.0) -> None:
        self.scheduler = scheduler
        self.backend = backend
        self.store = scheduler.store
        self.definitions = Definitions(
            scheduler.store,
            clock=scheduler.clock,
            misfire_grace_s=misfire_grace_s,
            admins=frozenset(getattr(scheduler, "admins", ())),
        )
        self._followers: dict[int, asyncio.Task[None]] = {}
        self._last_tick: float | None = None
        self._closed = False

    def install(self) -> None:
        """Register the command builder and the hooks on the scheduler (once per scheduler)."""
        if self.scheduler in _PLUGINS:
            return
        self.scheduler.commands[JobKind.NOTEBOOK] = self.command
        self.scheduler.end_hooks.append(self.on_end)
        self.scheduler.tick_hooks.append(self.on_tick)
        _PLUGINS[self.scheduler] = self

    def command(self, job: Job) -> list[str]:
        """The scheduler's command builder for notebook jobs."""
        node = job.placement.node if job.placement else None
        return notebook_command(job, python=_node_python(self.backend, node))

    # -- submitting ------------------------------------------------------------------------
    def submit(self, submission: Submission) -> tuple[Job | None, Any]:
        """Queue the job, or store the definition for a recurring one: ``(job, definition)``."""
        if submission.schedule is None:
            return self.scheduler.submit(submission.spec), None
        self.scheduler.check_feasible(submission.spec)
        definition = self.definitions.create(
            submission.spec,
            schedule=submission.schedule,
            timezone=submission.timezone,
            catch_up=submission.catch_up,
            name=submission.name,
            paused=submission.paused,
        )
        return None, definition

    # -- hooks -----------------------------------------------------------------------------
    async def on_tick(self, now: datetime) -> None:
        """Fire due definitions and follow the logs of running notebook jobs."""
        self._last_tick = asyncio.get_running_loop().time()
        try:
            if self.definitions.fire_due(now):
                self.scheduler.wake()
        except Exception:  # a broken definition must not stop the scheduling pass
            log.exception("gpusched: firing job definitions failed")
        running, _ = self.store.list_jobs(
            states=list(ACTIVE_STATES), kind=JobKind.NOTEBOOK, limit=None
        )
        for job in running:
            task = self._followers.get(job.id)
            if job.handle.get("log") and (task is None or task.done()) and not self._closed:
                self._followers[job.id] = asyncio.ensure_future(self._follow(job.id))

    async def on_end(self, job: Job) -> None:
        """Fetch the executed notebook and log beside the input; retry a failure if asked."""
        if job.spec.kind is not JobKind.NOTEBOOK:
            return
        follower = self._followers.pop(job.id, None)
        if follower is not None and not follower.done():
            # let it read the last progress lines; the job has ended, so the log is complete
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(follower), 5.0)
        try:
            await self._collect(job)
        finally:
            self._maybe_retry(job)

    async def close(self) -> None:
        """Stop following logs (the scheduler is stopping)."""
        self._closed = True
        tasks = [t for t in self._followers.values() if not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._followers.clear()

    # -- progress --------------------------------------------------------------------------
    def _resume_offset(self, job_id: int) -> int:
        """Where the log was left (0 the first time); creates the job's progress row."""
        try:
            with self.store.write_session() as s:
                row = s.get(ProgressRow, job_id)
                if row is not None:
                    return int(row.log_offset)
                s.add(
                    ProgressRow(job_id=job_id, log_offset=0, updated_at=self.scheduler.clock.now())
                )
        except IntegrityError:  # another server created it just now
            pass
        return 0

    def _stale(self) -> bool:
        """True once the scheduler stopped ticking (stopped, or this plugin was closed)."""
        if self._closed or not self.scheduler.running:
            return True
        if self._last_tick is None:
            return False
        interval = float(getattr(self.scheduler, "tick_interval_s", 1.0))
        return asyncio.get_running_loop().time() - self._last_tick > max(30.0, 20 * interval)

    async def _follow(self, job_id: int) -> None:
        """Turn the job's progress lines into events, resuming where the last one ended."""
        offset = self._resume_offset(job_id)
        pending = b""
        failures = 0
        while not self._stale():
            job = self.store.get_job(job_id)
            if job.state not in ACTIVE_STATES and failures:
                return
            try:
                async for chunk in self.backend.follow_log(job, offset=offset + len(pending)):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        offset += len(line) + 1
                        await self._progress(job_id, line, offset)
                return
            except GpuSchedError:
                failures += 1
                if failures > 10:
                    return
                await asyncio.sleep(min(10.0, 0.5 * 2**failures))

    async def _progress(self, job_id: int, line: bytes, offset: int) -> None:
        detail = parse_progress(line.decode("utf-8", errors="replace").rstrip("\r"))
        if detail is None or "cell" not in detail:
            return
        keep = {k: detail[k] for k in ("cell", "of", "index", "source") if k in detail}
        keep["source"] = str(keep.get("source", ""))[:200]
        now = self.scheduler.clock.now()
        with self.store.write_session() as s:
            moved = s.execute(
                update(ProgressRow)
                .where(ProgressRow.job_id == job_id, ProgressRow.log_offset < offset)
                .values(log_offset=offset, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount != 1:
                return  # another follower (another server) stored this line already
            add_event_row(
                s,
                EventRow(
                    at=now,
                    job_id=job_id,
                    kind="progress",
                    from_state=None,
                    to_state=None,
                    detail={**keep, "offset": offset},
                ),
            )
        await self.scheduler.notify()

    # -- results ---------------------------------------------------------------------------
    async def _collect(self, job: Job) -> None:
        staged = _staged(job.spec)
        node, job_dir = job.handle.get("node"), job.handle.get("job_dir")
        get_file = getattr(self.backend, "get_file", None)
        if not staged or not node or not job_dir or get_file is None:
            return
        folder = os.path.dirname(staged)
        stem = os.path.splitext(os.path.basename(staged))[0]
        stamp = (job.started_at or job.submitted_at).strftime("%Y%m%d-%H%M%S")
        base = _free_name(folder, f"{stem}-{stamp}-job{job.id}")
        rel_dir = posixpath.dirname(job.spec.notebook or "")
        got: dict[str, str] = {}
        remote = {
            ".ipynb": f"{job_dir}/{remote_output_name(job.spec)}",
            ".log": str(job.handle.get("log") or f"{job_dir}/output.log"),
        }
        for ext, path in remote.items():
            target = os.path.join(folder, base + ext)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpusched-", suffix=ext)
            os.close(fd)
            try:
                await get_file(node, path, tmp)
                os.replace(tmp, target)
                got[ext] = posixpath.join(rel_dir, base + ext)
            except GpuSchedError as exc:
                log.warning("gpusched: job %s: could not fetch %s: %s", job.id, path, exc.message)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if not got:
            return
        labels = dict(job.spec.labels)
        if ".ipynb" in got:
            labels[OUTPUT_LABEL] = got[".ipynb"]
        if ".log" in got:
            labels[LOG_LABEL] = got[".log"]
        self.store.update_job(
            job.id, spec=job.spec.model_copy(update={"labels": labels}), event=None
        )
        self.store.add_event(
            "notebook_output",
            job_id=job.id,
            detail={
                "notebook": got.get(".ipynb"),
                "log": got.get(".log"),
                "state": job.state.value,
            },
        )

    def _maybe_retry(self, job: Job) -> None:
        spec = job.spec
        if job.state is not JobState.FAILED or spec.retries <= 0:
            return
        tries = int(spec.labels.get("retry", "0"))
        if tries >= spec.retries:
            return
        backoff_s = float(spec.labels.get(BACKOFF_LABEL, DEFAULT_BACKOFF_S)) * 2**tries
        labels = {k: v for k, v in spec.labels.items() if k not in (OUTPUT_LABEL, LOG_LABEL)}
        labels.update(retry_of=spec.labels.get("retry_of", str(job.id)), retry=str(tries + 1))
        when = self.scheduler.clock.now() + timedelta(seconds=backoff_s)
        again = spec.model_copy(update={"labels": labels, "not_before": when})
        with contextlib.suppress(GpuSchedError):
            new = self.scheduler.submit(again)
            self.store.add_event(
                "retry",
                job_id=job.id,
                detail={
                    "retry_job_id": new.id,
                    "retry": tries + 1,
                    "of": spec.retries,
                    "not_before": when.isoformat(),
                },
            )


def _free_name(folder: str, base: str) -> str:
    name, n = base, 1
    while any(os.path.exists(os.path.join(folder, name + ext)) for ext in (".ipynb", ".log")):
        n += 1
        name = f"{base}-{n}"
    return name


def install(scheduler: Any, backend: Any) -> None:
    """Enable notebook jobs and recurring definitions on ``scheduler`` (extension plugin)."""
    NotebookPlugin(scheduler, backend).install()


async def shutdown(scheduler: Any) -> None:
    """Stop following logs before the server stops (extension plugin hook)."""
    plugin = _PLUGINS.get(scheduler)
    if plugin is not None:
        await plugin.close()
