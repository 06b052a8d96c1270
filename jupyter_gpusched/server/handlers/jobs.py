"""Job routes: list and submit, read, cancel, change, logs; leases as jobs of kind ``lease``."""

from __future__ import annotations

import contextlib

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from jupyter_gpusched.core.api import (
    MAX_LIMIT,
    MAX_LOG_CHUNK,
    MAX_OFFSET,
    JobList,
    JobUpdate,
    LeaseList,
    parse_body,
)
from jupyter_gpusched.core.errors import ForbiddenError, InvalidSpecError, NotFoundError
from jupyter_gpusched.core.models import JobKind, JobState, parse_spec

from .base import API, ID, ApiHandler, enum_arg, job_id_arg


class JobsHandler(ApiHandler):
    """``GET jobs`` lists the queue; ``POST jobs`` submits."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """List jobs, newest first, filtered by state, user and kind."""
        sched = await self.scheduler()
        states = None
        if (text := self.query("state")) is not None:
            states = [enum_arg(JobState, "state", s.strip()) for s in text.split(",") if s.strip()]
        user = self.query("user")
        if user == "me":
            user = self.username
        kind = self.query("kind")
        limit = self.query_int("limit", 100, 0, MAX_LIMIT)
        offset = self.query_int("offset", 0, 0, MAX_OFFSET)
        jobs, total = sched.list_jobs(
            states=states,
            user=user or None,
            kind=enum_arg(JobKind, "kind", kind) if kind else None,
            limit=limit,
            offset=offset,
        )
        views = [sched.job_view(j) for j in jobs]
        self.write_model(JobList(jobs=views, total=total, limit=limit, offset=offset))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Submit a job as the current user; answers 201 with its Location."""
        sched = await self.scheduler()
        body = self.json_body()
        if isinstance(body, dict) and "user" in body:
            raise InvalidSpecError("user", "is set by the server from your login; leave it out")
        if isinstance(body, dict):
            self.take_uploads(body)
        job = sched.submit(parse_spec(body, user=self.username))
        self.set_header("Location", url_path_join(self.base_url, API, "jobs", str(job.id)))
        self.write_model(sched.job_view(job), status=201)


class JobHandler(ApiHandler):
    """One job: read it, cancel it, change its priority or hold."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The job's current record."""
        sched = await self.scheduler()
        self.write_model(sched.job_view(sched.get_job(job_id_arg(job_id))))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Cancel: queued jobs leave the queue, running ones are stopped."""
        sched = await self.scheduler()
        job = await sched.cancel(job_id_arg(job_id), user=self.username, admin=self.is_admin())
        self.write_model(sched.job_view(job))

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
        self.write_model(sched.job_view(job))


class LogHandler(ApiHandler):
    """A job's combined stdout/stderr: a slice, or followed until the job ends."""

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
        try:
            async with contextlib.aclosing(sched.follow_log(jid, offset=offset)) as chunks:
                async for chunk in chunks:
                    self.write(chunk)
                    await self.flush()
        except StreamClosedError:
            return  # the client went away; nothing left to tell it
        self.finish(set_content_type="text/plain; charset=utf-8")


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
        self.write_model(LeaseList(leases=[sched.job_view(j) for j in jobs]))


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
        self.write_model(sched.job_view(job))


handlers: list[tuple[str, type]] = [
    (f"{API}/jobs", JobsHandler),
    (f"{API}/jobs/{ID}", JobHandler),
    (f"{API}/jobs/{ID}/log", LogHandler),
    (f"{API}/leases", LeasesHandler),
    (f"{API}/leases/{ID}", LeaseHandler),
]
