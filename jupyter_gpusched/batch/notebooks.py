"""Notebook jobs: submit a notebook with parameters, run it on a node, get it back executed.

A plugin of the server extension (``install(scheduler, backend)`` + ``handlers``):

* **command** -- a notebook job runs ``python -m jupyter_gpusched.node.nbrun NB --output OUT ...``
  (:mod:`jupyter_gpusched.node.nbrun`) in its job directory, where the SSH backend staged the input
  notebook (``spec.files``) by SFTP.
* **progress** -- nbrun prints ``##gpusched-progress {...}`` lines; a follower per running
  notebook job reads the log (``backend.follow_log``) and stores each as a ``progress`` event
  (``{"cell", "of", "index", "source", "offset"}``), so websocket subscribers see them.
* **results** -- when the job ends (succeeded, failed, cancelled) the executed notebook and the
  log are fetched (``backend.fetch_file``, read as the job's owner) beside the input as
  ``<stem>-<UTC start>-job<id>.ipynb`` and ``.log``; the job's ``outputs`` (its handle, which
  the server alone writes -- never its labels, which are the submitter's plain data) name them.
* **retries** -- a failed notebook job with ``retries`` is submitted again after
  ``retry_backoff_s * 2**n`` (a new job labelled ``retry_of``/``retry``).
* **when** -- ``now``, ``tonight`` (the next window that lets batch work run without a runtime
  limit), a window name, an ISO time, or a cron expression (a recurring definition, see
  :mod:`jupyter_gpusched.batch.definitions`), fired from the scheduler's tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import posixpath
import tempfile
import weakref
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from jupyter_gpusched.core.errors import GpuSchedError, NotFoundError, UnavailableError
from jupyter_gpusched.core.models import (
    ACTIVE_STATES,
    Job,
    JobKind,
    JobState,
)
from jupyter_gpusched.core.progress import parse_progress, strip_progress
from jupyter_gpusched.store.idempotency import KeyClaim
from jupyter_gpusched.store.orm import EventRow, ProgressRow
from jupyter_gpusched.store.rows import add_event_row

from .definitions import Definitions
from .requests import (
    BACKOFF_LABEL,
    DEFAULT_BACKOFF_S,
    Submission,
    notebook_command,
    remote_output_name,
    staged_notebook,
)

log = logging.getLogger(__name__)

#: Longest pause before a failed notebook job runs again, however many retries came before.
MAX_RETRY_PAUSE_S = 7 * 86400.0


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
    def submit(
        self, submission: Submission, claim: KeyClaim | None = None
    ) -> tuple[Job | None, Any]:
        """Queue the job, or store the definition for a recurring one: ``(job, definition)``.

        ``claim``: the request's idempotency key, committed with what it makes.
        """
        if submission.schedule is None:
            return self.scheduler.submit(submission.spec, claim), None
        self.scheduler.check_feasible(submission.spec)
        definition = self.definitions.create(
            submission.spec,
            schedule=submission.schedule,
            timezone=submission.timezone,
            catch_up=submission.catch_up,
            name=submission.name,
            paused=submission.paused,
            claim=claim,
        )
        return None, definition

    # -- hooks -----------------------------------------------------------------------------
    async def on_tick(self, now: datetime) -> None:
        """Fire due definitions and follow the logs of running notebook jobs."""
        self._last_tick = asyncio.get_running_loop().time()
        try:
            if self.definitions.fire_due(now):
                self.scheduler.wake()
        except UnavailableError:
            raise  # the store is away: the scheduler's loop says so once and tries again
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
        staged = staged_notebook(job.spec)
        node, job_dir = job.handle.get("node"), job.handle.get("job_dir")
        fetch_file = getattr(self.backend, "fetch_file", None)
        if not staged or not node or not job_dir or fetch_file is None:
            return
        folder = os.path.dirname(staged)
        stem = os.path.splitext(os.path.basename(staged))[0]
        stamp = (job.started_at or job.submitted_at).strftime("%Y%m%d-%H%M%S")
        base = _free_name(folder, f"{stem}-{stamp}-job{job.id}")
        rel_dir = posixpath.dirname(job.spec.notebook or "")
        got: dict[str, str] = {}
        remote = {
            "notebook": (".ipynb", f"{job_dir}/{remote_output_name(job.spec)}"),
            "log": (".log", str(job.handle.get("log") or f"{job_dir}/output.log")),
        }
        for part, (ext, path) in remote.items():
            target = os.path.join(folder, base + ext)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpusched-", suffix=ext)
            os.close(fd)
            try:
                await fetch_file(job, path, tmp)
                if ext == ".log":  # the copy is for people: no progress lines
                    with open(tmp, "rb") as f:
                        text = strip_progress(f.read())
                    with open(tmp, "wb") as f:
                        f.write(text)
                os.replace(tmp, target)
                got[part] = posixpath.join(rel_dir, base + ext)
            except GpuSchedError as exc:
                log.warning("gpusched: job %s: could not fetch %s: %s", job.id, path, exc.message)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if not got:
            return
        handle = self.store.get_job(job.id).handle
        self.store.update_job(job.id, handle={**handle, "outputs": got}, event=None)
        self.store.add_event(
            "notebook_output",
            job_id=job.id,
            detail={
                "notebook": got.get("notebook"),
                "log": got.get("log"),
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
        backoff_s = retry_pause_s(spec.labels.get(BACKOFF_LABEL), tries)
        labels = dict(spec.labels)
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


def retry_pause_s(first_s: str | None, tries: int) -> float:
    """The pause before retry ``tries + 1``: the first pause doubled each time, a week at most.

    ``first_s`` is the job's label as stored; one that is not a finite number of seconds (a
    job stored before the bounds) counts as the default.
    """
    try:
        first = float(first_s) if first_s is not None else DEFAULT_BACKOFF_S
    except ValueError:
        first = DEFAULT_BACKOFF_S
    if not math.isfinite(first) or first < 0:
        first = DEFAULT_BACKOFF_S
    return min(MAX_RETRY_PAUSE_S, first * 2.0 ** min(tries, 64))


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
