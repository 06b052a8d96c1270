"""Job routes: list and submit, read, cancel, change, logs; leases as jobs of kind ``lease``."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_gpusched.batch.requests import script_start
from jupyter_gpusched.core.api import (
    MAX_ARRAY,
    MAX_ARRAY_TASKS,
    MAX_ID,
    MAX_LIMIT,
    MAX_LOG_CHUNK,
    MAX_OFFSET,
    JobArray,
    JobList,
    JobUpdate,
    LeaseList,
    parse_body,
)
from jupyter_gpusched.core.errors import ForbiddenError, InvalidSpecError, NotFoundError
from jupyter_gpusched.core.limits import refusal
from jupyter_gpusched.core.models import (
    ARRAY_BEING_QUEUED,
    Job,
    JobKind,
    JobSpec,
    JobState,
    parse_spec,
)
from jupyter_gpusched.scheduling.timeline import timeline
from jupyter_gpusched.store.availability import off_the_loop
from jupyter_gpusched.store.idempotency import KeyClaim, KeyRecord

from ..idempotency import create_once, in_flight
from ..uploads import PendingUploads
from .base import API, ID, ApiHandler, enum_arg, job_id_arg

#: Most stored events a timeline reads (a notebook's progress lines count).
MAX_EVENTS = 20_000


class JobsHandler(ApiHandler):
    """``GET jobs`` lists the queue; ``POST jobs`` submits."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """A page of jobs by state, user, kind and array; oldest first unless ``order``."""
        sched = await self.scheduler()
        states = None
        if (text := self.query("state")) is not None:
            states = [enum_arg(JobState, "state", s.strip()) for s in text.split(",") if s.strip()]
        user = self.query("user")
        if user == "me":
            user = self.username
        kind = self.query("kind")
        array = self.query("array")
        limit = self.query_int("limit", 100, 0, MAX_LIMIT)
        offset = self.query_int("offset", 0, 0, MAX_OFFSET)
        jobs, total = sched.list_jobs(
            states=states,
            user=user or None,
            kind=enum_arg(JobKind, "kind", kind) if kind else None,
            array_id=None if array is None else self.query_int("array", 0, 0, MAX_ID),
            limit=limit,
            offset=offset,
            order=self.query("order") or "id",
        )
        views = [sched.job_view(j, self.viewer) for j in jobs]
        arrays = []
        if states is None or JobState.QUEUED in states:  # pending tasks wait as queued ones
            found = sched.store.list_arrays(
                user=user or None, ids=None if array is None else [int(array)], limit=100
            )
            found = [a for a in found if not kind or a.spec.kind.value == kind]
            arrays = sched.array_views(found, self.viewer)
        self.write_model(
            JobList(jobs=views, total=total, limit=limit, offset=offset, arrays=arrays)
        )

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Submit a job as the current user; answers 201 with its Location.

        A list of jobs, or one job with ``array: N``, is a bulk submit: all queued or none
        (in chunks others' requests go between, see ``submit_bulk``), answered as a
        :class:`~jupyter_gpusched.core.api.JobArray`.
        Files sent with the jobs are written only once every job was checked, and removed
        again when the submit fails (``on_finish``). With an ``Idempotency-Key``, a repeat
        gets the first submit's answer (:mod:`..idempotency`).
        """
        sched = await self.scheduler()

        async def submit(claim: KeyClaim | None) -> None:
            await self._submit(sched, claim)

        async def replay(made: KeyRecord) -> None:
            await self._replay(sched, made)

        await create_once(self, sched, "jobs", submit, replay)

    async def _submit(self, sched: Any, claim: KeyClaim | None) -> None:
        body = self.json_body()
        self._check_limits(sched, body)
        self._uploads: list[PendingUploads] = []
        self._bounds = sched.policy.spec_bounds(sched.clock.now())  # one for all the jobs
        self._sched = sched
        with sched.cap_in_context():
            await self._submit_checked(sched, claim, body)

    async def _submit_checked(self, sched: Any, claim: KeyClaim | None, body: Any) -> None:
        if isinstance(body, list):
            specs = self._specs(body)
            self._write_uploads()
            jobs = await sched.submit_bulk(specs, claim)
        else:
            count = body.pop("array", None) if isinstance(body, dict) else None
            _check_array(count)
            spec = self._spec(body)
            self._write_uploads()
            if count is None:
                self._write_job(sched, await sched.submit_grouped(spec, claim))
                return
            record, head = await sched.submit_array(spec, count, claim)
            self._write_record(sched, record, [head])
            return
        await self._write_array(sched, jobs)

    async def _replay(self, sched: Any, made: KeyRecord) -> None:
        """The answer of the submit that stored ``made``: its job, or its array, as now."""
        if made.target == "job":
            self._write_job(sched, sched.get_job(made.target_id))
            return
        record = await off_the_loop(sched.store.get_array, made.target_id)
        if record is not None:  # an array: N, one record
            jobs, _ = await off_the_loop(sched.list_jobs, array_id=made.target_id, limit=100)
            self._write_record(sched, record, jobs)
            return
        jobs, _ = await off_the_loop(sched.list_jobs, array_id=made.target_id, limit=None)
        if jobs and jobs[0].held and jobs[0].reason == ARRAY_BEING_QUEUED:
            raise in_flight()  # its tasks are still being written
        await self._write_array(sched, jobs)

    def _write_job(self, sched: Any, job: Job) -> None:
        self.set_header("Location", url_path_join(self.base_url, API, "jobs", str(job.id)))
        self.write_model(sched.job_view(job, self.viewer), status=201)

    def _check_limits(self, sched: Any, body: Any) -> None:
        """The caller's limits, before anything is written: rate, bulk size, room in the queue.

        A bulk submit counts every job it queues; its size is the request's own fault (422),
        the rest passes with time (429).
        """
        mine = self.caller_limits(sched)
        if mine.limits.off:
            return
        self.gate.take_submit(mine)
        items = body if isinstance(body, list) else [body]
        count = len(body) if isinstance(body, list) else 1
        if isinstance(body, dict) and "array" in body:
            array = body["array"]
            if isinstance(array, int) and not isinstance(array, bool) and array > 0:
                count = array
        most = mine.limits.array_size
        if most is not None and count > most and count > 1:
            field = "body" if isinstance(body, list) else "array"
            raise InvalidSpecError(field, refusal(mine, "array_size", 0, count))
        leases = sum(
            1 for item in items if isinstance(item, dict) and item.get("kind") == "lease"
        ) * (count if isinstance(body, dict) else 1)
        sched.check_room(mine, jobs=count, leases=leases)

    def _specs(self, body: list[Any]) -> list[JobSpec]:
        if not 1 <= len(body) <= MAX_ARRAY:
            raise InvalidSpecError(
                "body",
                f"a list of 1 to {MAX_ARRAY} jobs, got {len(body)}; split bigger submissions",
            )
        specs = []
        for i, item in enumerate(body):
            if isinstance(item, dict) and "array" in item:
                raise InvalidSpecError(
                    f"{i}.array", "arrays cannot be nested in a list; list the jobs instead"
                )
            try:
                specs.append(self._spec(item))
            except InvalidSpecError as exc:
                field, _, message = str(exc.message).partition(": ")
                raise InvalidSpecError(f"{i}.{exc.field}", message or field) from None
        return specs

    def _spec(self, body: Any) -> JobSpec:
        if isinstance(body, dict) and "user" in body:
            raise InvalidSpecError("user", "is set by the server from your login; leave it out")
        if isinstance(body, dict) and (pending := self.take_uploads(body)) is not None:
            self._uploads.append(pending)
        if isinstance(body, dict) and ("at" in body or "timezone" in body):
            _start_at(body, self._sched)
        return parse_spec(body, bounds=self._bounds, user=self.username)

    def _write_uploads(self) -> None:
        for pending in self._uploads:
            self.write_uploads(pending)

    def _write_record(self, sched: Any, record: Any, jobs: list[Job]) -> None:
        """The answer of an ``array: N`` submit: the array, and the tasks made so far."""
        query = urllib.parse.urlencode({"array": record.id})
        self.set_header("Location", url_path_join(self.base_url, API, "jobs") + "?" + query)
        views = [sched.job_view(j, self.viewer) for j in jobs]
        answer = JobArray(array_id=record.id, size=record.size, pending=record.pending, jobs=views)
        self.write_model(answer, status=201)

    async def _write_array(self, sched: Any, jobs: list[Job]) -> None:
        array_id = jobs[0].id
        query = urllib.parse.urlencode({"array": array_id})
        self.set_header("Location", url_path_join(self.base_url, API, "jobs") + "?" + query)
        viewer = self.viewer

        def answer() -> bytes:
            views = [sched.job_view(j, viewer) for j in jobs]
            answer = JobArray(array_id=array_id, size=len(views), jobs=views)
            return answer.model_dump_json().encode()

        # thousands of views are a fraction of a second: in a thread, so others go between
        body = answer() if len(jobs) <= 100 else await off_the_loop(answer)
        self.set_status(201)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


def _start_at(body: dict[str, Any], sched: Any) -> None:
    """``at`` (and ``timezone``) of a request, read into its ``not_before``."""
    at, tz_name = body.pop("at", None), body.pop("timezone", None)
    if at is None:
        raise InvalidSpecError("timezone", "is the timezone of at; give at too")
    if body.get("not_before") is not None:
        raise InvalidSpecError("at", "give at or not_before, not both")
    start = script_start(at, tz_name, sched.policy, sched.clock.now())
    if start is not None:
        body["not_before"] = start.isoformat()


def _check_array(count: Any) -> None:
    """``array``: absent, or a whole number of tasks up to :data:`MAX_ARRAY_TASKS`.

    The caller's ``array_size`` limit (checked before) is what a lab sets below that.
    """
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ARRAY_TASKS
    ):
        raise InvalidSpecError(
            "array",
            f"must be a whole number of tasks from 1 to {MAX_ARRAY_TASKS}, got {count!r}",
        )


class JobHandler(ApiHandler):
    """One job: read it, cancel it, change its priority or hold."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The job's current record."""
        sched = await self.scheduler()
        self.write_model(sched.job_view(sched.get_job(job_id_arg(job_id)), self.viewer))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Cancel: queued jobs leave the queue, running ones are stopped."""
        sched = await self.scheduler()
        job = await sched.cancel(job_id_arg(job_id), user=self.username, admin=self.is_admin())
        self.write_model(sched.job_view(job, self.viewer))

    @web.authenticated
    @authorized
    async def patch(self, job_id: str) -> None:
        """Change ``priority`` and/or ``held``."""
        sched = await self.scheduler()
        change = parse_body(JobUpdate, self.json_body(), '{"held": true}')
        job = sched.update(
            job_id_arg(job_id),
            user=self.username,
            admin=self.is_admin(),
            **change.model_dump(exclude_none=True),
        )
        self.write_model(sched.job_view(job, self.viewer))


class LogHandler(ApiHandler):
    """A job's combined stdout/stderr: a slice, or followed until the job ends.

    A follow holds an SSH channel on the job's node for as long as it lasts, so it stops as
    soon as its client goes (even while the job writes nothing), and each user holds at most
    ``GpuSchedApp.max_follows_per_user`` at once (and counts against the policy's ``streams``).
    """

    _follow: asyncio.Task[None] | None = None
    _gone = False
    _ended_by: str | None = None  # why the server ended the follow (a revoked token)

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """``?offset=&limit=`` for a slice; ``?follow=1`` streams (chunked) until the end."""
        sched = await self.scheduler()
        jid = job_id_arg(job_id)
        job = sched.get_job(jid)  # 404 before any byte is sent
        if job.user != self.username and not self.is_admin():
            raise ForbiddenError(
                f"job {jid} belongs to {job.user}; only its owner or an admin may read its log"
            )
        offset = self.query_int("offset", 0, 0, MAX_OFFSET)
        limit = self.query_int("limit", 65536, 1, MAX_LOG_CHUNK)
        follow = self.query_bool("follow")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Log-Offset", str(offset))
        if not follow:
            data = await sched.read_log(jid, offset=offset, limit=limit)
            self.set_header("X-Log-Offset", str(offset + len(data)))
            self.finish(data, set_content_type="text/plain; charset=utf-8")
            return
        close = self.gate.open_stream(self.caller_limits(sched), follow=True)  # or 429
        self._follow = asyncio.ensure_future(self._pump(sched, jid, offset))
        if self._gone:  # the client left while the job was looked up: nothing to follow
            self._follow.cancel()
        self._guard_follow()
        try:
            await self._follow
        except StreamClosedError:
            return  # the client went away; nothing left to tell it
        except asyncio.CancelledError:
            if self._gone:
                return
            if self._ended_by is None:
                raise
        finally:
            close()
        self.finish(set_content_type="text/plain; charset=utf-8")

    def _guard_follow(self) -> None:
        """End the follow once its caller's token or admin right is revoked (:mod:`..streams`).

        The check stops when the follow ends, however it ends.
        """
        from ..streams import StreamGuard

        assert self._follow is not None
        guard = StreamGuard(self, self._end)
        guard.start()
        self._follow.add_done_callback(lambda _: guard.stop())

    def _end(self, why: str) -> None:
        """The caller's token no longer holds: end the follow (its body ends cleanly)."""
        self._ended_by = why
        if self._follow is not None:
            self._follow.cancel()

    async def _pump(self, sched: Any, job_id: int, offset: int) -> None:
        await self.flush()  # the status line now: the client knows the follow is on
        async with contextlib.aclosing(sched.follow_log(job_id, offset=offset)) as chunks:
            async for chunk in chunks:
                self.write(chunk)
                await self.flush()

    def on_connection_close(self) -> None:
        """The client went away: stop following (its node channel is freed at once)."""
        self._gone = True
        if self._follow is not None:
            self._follow.cancel()
        super().on_connection_close()


class JobEventsHandler(ApiHandler):
    """``GET jobs/{id}/events``: the job's timeline (state changes with reasons), oldest first."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The job's events as its page shows them, cut like the events websocket's."""
        sched = await self.scheduler()
        jid = job_id_arg(job_id)
        job = sched.get_job(jid)  # 404 for an unknown job
        events = sched.store.list_events(job_id=jid, limit=MAX_EVENTS)
        self.write_model(timeline(events, viewer=self.viewer, owner=job.user))


class LeasesHandler(ApiHandler):
    """``GET leases``: my live leases (admins: everyone's with ``?user=all``)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Queued, starting and running leases."""
        sched = await self.scheduler()
        who = self.query("user", "me")
        if who not in ("me", self.username) and not self.is_admin():
            raise web.HTTPError(403, "only admins may list other users' leases")
        user = None if who == "all" else self.username if who == "me" else who
        live = [JobState.QUEUED, JobState.STARTING, JobState.RUNNING]
        jobs, _ = sched.list_jobs(states=live, user=user, kind=JobKind.LEASE, limit=MAX_LIMIT)
        self.write_model(LeaseList(leases=[sched.job_view(j, self.viewer) for j in jobs]))


class LeaseHandler(ApiHandler):
    """``DELETE leases/{id}``: release a lease (the same as cancelling it)."""

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Release the lease; its remote kernel is shut down."""
        sched = await self.scheduler()
        jid = job_id_arg(job_id)
        if sched.get_job(jid).spec.kind is not JobKind.LEASE:
            raise NotFoundError(f"job {jid} is not a lease; cancel it with DELETE jobs/{jid}")
        job = await sched.cancel(jid, user=self.username, admin=self.is_admin())
        self.write_model(sched.job_view(job, self.viewer))


handlers: list[tuple[str, type]] = [
    (f"{API}/jobs", JobsHandler),
    (f"{API}/jobs/{ID}", JobHandler),
    (f"{API}/jobs/{ID}/log", LogHandler),
    (f"{API}/jobs/{ID}/events", JobEventsHandler),
    (f"{API}/leases", LeasesHandler),
    (f"{API}/leases/{ID}", LeaseHandler),
]
