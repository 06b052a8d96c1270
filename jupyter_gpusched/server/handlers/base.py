"""REST and websocket handlers under ``{base_url}gpusched/api/``.

Handlers are thin: read and check the request, call the scheduler, write JSON. Every error a
request can cause goes through :func:`error_reply`, the one table from exceptions to HTTP
status and a JSON body saying what to fix; bad input never becomes a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from datetime import datetime
from http.client import responses
from importlib import resources
from typing import Any

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web, websocket
from tornado.iostream import StreamClosedError

from jupyter_gpusched.core.errors import (
    BadRequestError,
    ForbiddenError,
    GpuSchedError,
    InvalidSpecError,
    NotFoundError,
)
from jupyter_gpusched.core.models import JobKind, JobState, PriorityClass, parse_spec

AUTH_RESOURCE = "gpusched"
API = "gpusched/api"
MAX_LIMIT = 1000
MAX_LOG_CHUNK = 1 << 20
_MAX_ID = 2**63 - 1  # SQL BIGINT: larger ids cannot exist, and must not reach the store
_MAX_OFFSET = 2**53
_SHARED_TOKEN_PROVIDERS = (IdentityProvider, PasswordIdentityProvider)
_STATUS_NAMES = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    503: "Unavailable",
}
_HTTP_HINTS = {
    401: "missing or invalid token; send 'Authorization: token <TOKEN>' "
    "(see 'jupyter server list')",
    403: "this user is not authorized to use the GPU scheduler",
    404: "no such route; see the OpenAPI file at gpusched/api/openapi.yaml",
    405: "this route does not take that HTTP method; see gpusched/api/openapi.yaml",
}


def error_reply(exc: BaseException | None, status: int) -> tuple[int, dict[str, Any]]:
    """The one table: an exception (or a bare status) -> (HTTP status, JSON error body)."""
    if isinstance(exc, GpuSchedError):
        return exc.status, exc.to_json()
    if isinstance(exc, web.HTTPError):
        status = exc.status_code
        message = exc.log_message % exc.args if exc.log_message and exc.args else exc.log_message
        name = _STATUS_NAMES.get(status, "HTTPError")
        return status, {"error": name, "message": message or _HTTP_HINTS.get(status, name)}
    if status < 500:
        name = _STATUS_NAMES.get(status, "HTTPError")
        return status, {"error": name, "message": _HTTP_HINTS.get(status, responses[status])}
    return 500, {"error": "InternalError", "message": "unexpected server error; see the log"}


class _GpuSchedMixin:
    """What every handler shares: the scheduler, the user, the error table, query parsing."""

    auth_resource = AUTH_RESOURCE

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs["exc_info"][1] if kwargs.get("exc_info") else None
        status, body = error_reply(exc, status_code)
        if status == 403 and getattr(self, "_jupyter_current_user", None) is None:
            # Jupyter refuses requests without credentials with 403; they are 401 ("who are
            # you?"), kept apart from 403 ("you may not").
            status, body = error_reply(web.HTTPError(401), 401)
        self.set_status(status)  # type: ignore[attr-defined]
        if status == 401:
            self.set_header("WWW-Authenticate", "token")  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(json.dumps(body))  # type: ignore[attr-defined]

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, GpuSchedError):
            self.log.info("gpusched %s: %s", type(value).__name__, value)  # type: ignore[attr-defined]
        else:
            super().log_exception(typ, value, tb)  # type: ignore[misc]

    async def scheduler(self) -> Any:
        """The running scheduler; waits briefly while the extension is still starting."""
        sched = self.settings.get("gpusched")  # type: ignore[attr-defined]
        if sched is None:
            sched = await self.settings["gpusched_app"].wait_ready(10.0)  # type: ignore[attr-defined]
        if sched is None:
            raise web.HTTPError(503, "the GPU scheduler has not started; see the server log")
        return sched

    @property
    def username(self) -> str:
        """Who is asking, as the server's identity provider says.

        Jupyter's stock providers give every token-only request a fresh random anonymous user;
        on such a single-user server every token holder is the server's owner, so they all
        get one stable name (``GpuSchedApp.anonymous_user``).
        """
        if type(self.identity_provider) in _SHARED_TOKEN_PROVIDERS:  # type: ignore[attr-defined]
            return str(self.settings["gpusched_anonymous_user"])  # type: ignore[attr-defined]
        return str(self.current_user.username)  # type: ignore[attr-defined]

    def is_admin(self) -> bool:
        """Admins may act on everyone's jobs."""
        return self.username in self.settings.get("gpusched_admins", ())  # type: ignore[attr-defined]

    def query(self, name: str, default: str | None = None) -> str | None:
        """One query argument; repeated arguments are refused rather than guessed at."""
        values = self.get_query_arguments(name)  # type: ignore[attr-defined]
        if len(values) > 1:
            raise InvalidSpecError(name, "give this query argument once")
        return values[0] if values else default

    def query_int(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer query argument within [lo, hi]."""
        text = self.query(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            raise InvalidSpecError(name, f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise InvalidSpecError(name, f"must be between {lo} and {hi}, got {value}")
        return value

    def query_bool(self, name: str) -> bool:
        """A flag query argument: 1/true/yes or 0/false/no."""
        text = (self.query(name) or "0").strip().lower()
        if text not in ("1", "true", "yes", "0", "false", "no", ""):
            raise InvalidSpecError(name, f"{text!r} is not a flag; use 1 or 0")
        return text in ("1", "true", "yes")


def _job_id(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > _MAX_ID:
        raise NotFoundError(f"job {text} does not exist; list jobs with GET gpusched/api/jobs")
    return int(text)


def _reject_constant(name: str) -> float:
    raise BadRequestError(f"{name} is not a number JSON allows; send a finite number")


class ApiHandler(_GpuSchedMixin, APIHandler):
    """Base of the REST handlers: JSON in, JSON out."""

    def json_body(self) -> Any:
        """The request body as JSON, or a 400 that says why it could not be read."""
        try:
            return json.loads(self.request.body or b"", parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            hint = f"the body is not valid JSON ({exc}); send a JSON object"
            raise BadRequestError(hint) from None
        except RecursionError:
            raise BadRequestError("the JSON body is nested too deeply") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        """Answer ``data`` as JSON."""
        self.set_status(status)
        self.finish(json.dumps(data))


class JobsHandler(ApiHandler):
    """``GET jobs`` lists the queue; ``POST jobs`` submits."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """List jobs, newest first, filtered by state, user and kind."""
        sched = await self.scheduler()
        states = None
        if (text := self.query("state")) is not None:
            states = [_enum(JobState, "state", s.strip()) for s in text.split(",") if s.strip()]
        user = self.query("user")
        if user == "me":
            user = self.username
        kind = self.query("kind")
        limit = self.query_int("limit", 100, 0, MAX_LIMIT)
        offset = self.query_int("offset", 0, 0, _MAX_OFFSET)
        jobs, total = sched.list_jobs(
            states=states,
            user=user or None,
            kind=_enum(JobKind, "kind", kind) if kind else None,
            limit=limit,
            offset=offset,
        )
        views = [sched.job_view(j) for j in jobs]
        self.write_json({"jobs": views, "total": total, "limit": limit, "offset": offset})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Submit a job as the current user; answers 201 with its Location."""
        sched = await self.scheduler()
        body = self.json_body()
        if isinstance(body, dict) and "user" in body:
            raise InvalidSpecError("user", "is set by the server from your login; leave it out")
        job = sched.submit(parse_spec(body, user=self.username))
        self.set_header("Location", url_path_join(self.base_url, API, "jobs", str(job.id)))
        self.write_json(sched.job_view(job), status=201)


class JobHandler(ApiHandler):
    """One job: read it, cancel it, change its priority or hold."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """The job's current record."""
        sched = await self.scheduler()
        self.write_json(sched.job_view(sched.get_job(_job_id(job_id))))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Cancel: queued jobs leave the queue, running ones are stopped."""
        sched = await self.scheduler()
        job = await sched.cancel(_job_id(job_id), user=self.username)
        self.write_json(sched.job_view(job))

    @web.authenticated
    @authorized
    async def patch(self, job_id: str) -> None:
        """Change ``priority`` and/or ``held``."""
        sched = await self.scheduler()
        body = self.json_body()
        if not isinstance(body, dict):
            raise InvalidSpecError("body", 'must be a JSON object like {"held": true}')
        unknown = sorted(set(body) - {"priority", "held"})
        if unknown:
            raise InvalidSpecError(unknown[0], "unknown field; only priority and held can change")
        if not body:
            raise InvalidSpecError("body", "give priority and/or held")
        changes: dict[str, Any] = {}
        if "priority" in body:
            if not isinstance(body["priority"], str):
                raise InvalidSpecError("priority", "must be 'interactive' or 'batch'")
            changes["priority"] = _enum(PriorityClass, "priority", body["priority"])
        if "held" in body:
            if not isinstance(body["held"], bool):
                raise InvalidSpecError("held", "must be true or false")
            changes["held"] = body["held"]
        job = sched.update(_job_id(job_id), user=self.username, **changes)
        self.write_json(sched.job_view(job))


class LogHandler(ApiHandler):
    """A job's combined stdout/stderr: a slice, or followed until the job ends."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """``?offset=&limit=`` for a slice; ``?follow=1`` streams (chunked) until the end."""
        sched = await self.scheduler()
        jid = _job_id(job_id)
        job = sched.get_job(jid)  # 404 before any byte is sent
        if job.user != self.username and not self.is_admin():
            raise ForbiddenError(
                f"job {jid} belongs to {job.user}; only its owner or an admin may read its log"
            )
        offset = self.query_int("offset", 0, 0, _MAX_OFFSET)
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
        self.write_json({"leases": [sched.job_view(j) for j in jobs]})


class LeaseHandler(ApiHandler):
    """``DELETE leases/{id}``: release a lease (the same as cancelling it)."""

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Release the lease; its remote kernel is shut down."""
        sched = await self.scheduler()
        jid = _job_id(job_id)
        if sched.get_job(jid).spec.kind is not JobKind.LEASE:
            raise NotFoundError(f"job {jid} is not a lease; cancel it with DELETE jobs/{jid}")
        self.write_json(sched.job_view(await sched.cancel(jid, user=self.username)))


class ClusterHandler(ApiHandler):
    """``GET cluster``: nodes, GPUs, fragmentation figures, the window in force, queue size."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The cluster map as the scheduler sees it now."""
        self.write_json((await self.scheduler()).cluster_view())


class PolicyHandler(ApiHandler):
    """``GET policy?at=ISO``: which rules hold now (or at a given time), in words."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The policy window at ``at`` (default now) and an explanation."""
        sched = await self.scheduler()
        at = None
        if (text := self.query("at")) is not None:
            try:
                at = datetime.fromisoformat(text.strip())
            except ValueError:
                raise InvalidSpecError("at", f"{text!r} is not an ISO 8601 time") from None
            if at.tzinfo is None:
                raise InvalidSpecError("at", "needs a timezone, e.g. 2026-11-23T22:00:00+01:00")
        self.write_json(sched.policy_view(at))


class SpecHandler(ApiHandler):
    """``GET openapi.yaml``: the API description this server implements."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The shipped OpenAPI file."""
        text = (
            resources.files("jupyter_gpusched.server").joinpath("openapi.yaml").read_text("utf-8")
        )
        self.finish(text, set_content_type="application/yaml")


class EventsHandler(_GpuSchedMixin, websocket.WebSocketHandler, JupyterHandler):
    """Websocket of scheduler events; ``?after=ID`` replays stored events newer than ID.

    The scheduler adds ``cluster`` messages (no id) after changes, at most one per second.
    """

    _pump: asyncio.Task[None] | None = None

    def set_default_headers(self) -> None:
        """JupyterHandler's page headers make no sense on a websocket."""

    async def prepare(self) -> None:  # type: ignore[override]
        """Refuse unauthenticated upgrades instead of redirecting them to the login page."""
        await JupyterHandler.prepare(self, _redirect_to_login=False)

    @ws_authenticated
    @authorized
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Check the query, then upgrade to a websocket."""
        self._sched = await self.scheduler()
        self._after = self.query_int("after", 0, -1, _MAX_ID)  # -1: only new events
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Start relaying events to this client."""
        self._pump = asyncio.ensure_future(self._relay())

    async def _relay(self) -> None:
        try:
            async for event in self._sched.subscribe(after_id=self._after):
                await self.write_message(json.dumps(event, default=_json_default))
        except websocket.WebSocketClosedError:
            pass

    def on_message(self, message: str | bytes) -> None:
        """Clients only listen; anything they send is ignored."""

    def on_close(self) -> None:
        """Stop relaying."""
        if self._pump is not None:
            self._pump.cancel()


class NoRouteHandler(ApiHandler):
    """Unknown paths under the API answer a JSON 404, like everything else here."""

    def _no_route(self, *args: Any) -> None:
        raise web.HTTPError(404)

    get = post = put = patch = delete = _no_route


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return str(value)


def _enum(cls: Any, name: str, value: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise InvalidSpecError(name, f"{value!r} is not one of {allowed}") from None


_ID = r"([^/]+)"  # checked in the handler, so a bad id is a JSON 404 like an unknown one
default_handlers: list[tuple[str, type]] = [
    (f"{API}/jobs", JobsHandler),
    (f"{API}/jobs/{_ID}", JobHandler),
    (f"{API}/jobs/{_ID}/log", LogHandler),
    (f"{API}/leases", LeasesHandler),
    (f"{API}/leases/{_ID}", LeaseHandler),
    (f"{API}/cluster", ClusterHandler),
    (f"{API}/policy", PolicyHandler),
    (f"{API}/events", EventsHandler),
    (f"{API}/openapi.yaml", SpecHandler),
]
#: Last route of all (after plugin routes): unknown API paths answer a JSON 404.
NO_ROUTE: tuple[str, type] = (f"{API}/.*", NoRouteHandler)
default_handlers.append(NO_ROUTE)

__all__ = ["AUTH_RESOURCE", "NO_ROUTE", "default_handlers", "error_reply"]
