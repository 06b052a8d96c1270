"""REST and websocket handlers under ``{base_url}gpusched/api/``.

Handlers are thin: read and check the request, call the scheduler, write JSON. Every error a
request can cause goes through :func:`error_reply`, the one table from exceptions to HTTP
status and a JSON body saying what to fix; bad input never becomes a 500.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Collection
from http.client import responses
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.base.handlers import APIHandler
from pydantic import BaseModel
from tornado import web

from jupyter_gpusched.core.api import MAX_ID, Error
from jupyter_gpusched.core.errors import (
    BadRequestError,
    GpuSchedError,
    InvalidSpecError,
    NotFoundError,
)
from jupyter_gpusched.core.limits import UserLimits
from jupyter_gpusched.core.models import TERMINAL_STATES, JobState
from jupyter_gpusched.core.privacy import Viewer
from jupyter_gpusched.core.units import format_size_bytes
from jupyter_gpusched.server.auth import AUTH_RESOURCE
from jupyter_gpusched.server.uploads import (
    PendingUploads,
    check_uploads,
    local_files,
    user_dir,
)
from jupyter_gpusched.server.userlimits import LimitGate

API = "gpusched/api"
_SHARED_TOKEN_PROVIDERS = (IdentityProvider, PasswordIdentityProvider)
_STATUS_NAMES = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    429: "TooManyRequests",
    503: "Unavailable",
}
_HTTP_HINTS = {
    401: "missing or invalid token; send 'Authorization: token <TOKEN>' "
    "(see 'jupyter server list')",
    403: "this user is not authorized to use the GPU scheduler",
    404: "no such route; see the OpenAPI file at gpusched/api/openapi.yaml",
    405: "this route does not take that HTTP method; see gpusched/api/openapi.yaml",
}


def error_reply(exc: BaseException | None, status: int) -> tuple[int, Error]:
    """The one table: an exception (or a bare status) -> (HTTP status, error body)."""
    if isinstance(exc, GpuSchedError):
        field = getattr(exc, "field", None)
        return exc.status, Error(error=type(exc).__name__, message=exc.message, field=field)
    if isinstance(exc, web.HTTPError):
        status = exc.status_code
        message = exc.log_message % exc.args if exc.log_message and exc.args else exc.log_message
        name = _STATUS_NAMES.get(status, "HTTPError")
        return status, Error(error=name, message=message or _HTTP_HINTS.get(status, name))
    if status < 500:
        name = _STATUS_NAMES.get(status, "HTTPError")
        return status, Error(error=name, message=_HTTP_HINTS.get(status, responses[status]))
    return 500, Error(error="InternalError", message="unexpected server error; see the log")


class GpuSchedMixin:
    """What every handler shares: the scheduler, the user, the error table, query parsing."""

    auth_resource = AUTH_RESOURCE

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error, ours or Tornado's, as the one JSON error body."""
        exc = kwargs["exc_info"][1] if kwargs.get("exc_info") else None
        status, body = error_reply(exc, status_code)
        if status == 403 and getattr(self, "_jupyter_current_user", None) is None:
            # Jupyter refuses requests without credentials with 403; they are 401 ("who are
            # you?"), kept apart from 403 ("you may not").
            status, body = error_reply(web.HTTPError(401), 401)
        self.set_status(status)  # type: ignore[attr-defined]
        if status == 401:
            self.set_header("WWW-Authenticate", "token")  # type: ignore[attr-defined]
        retry_s = getattr(exc, "retry_after_s", None)
        if status in (429, 503) or retry_s:  # over a limit, the store away, a request in flight
            retry_s = retry_s or 5.0
            self.set_header("Retry-After", str(max(1, math.ceil(retry_s))))  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(body.model_dump_json())  # type: ignore[attr-defined]

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """Our errors are the caller's to fix: one info line, no traceback."""
        if isinstance(value, GpuSchedError):
            self.log.info("gpusched %s: %s", type(value).__name__, value)  # type: ignore[attr-defined]
        else:
            super().log_exception(typ, value, tb)  # type: ignore[misc]

    async def scheduler(self) -> Any:
        """The running scheduler; waits briefly while the extension is still starting."""
        sched = self.settings.get("gpusched")  # type: ignore[attr-defined]
        if sched is not None:
            return sched
        app = self.settings["gpusched_app"]  # type: ignore[attr-defined]
        if app.start_error is not None:  # the store is away: it starts once the store is back
            raise app.start_error
        sched = await app.wait_ready(10.0)
        if sched is None:
            raise app.start_error or web.HTTPError(
                503, "the GPU scheduler has not started; see the server log"
            )
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
        """Admins may act on everyone's jobs.

        The lab-wide service's authentication says who they are (a Hub scope or group, the
        service operator's list); a single-user server has its own ``admin_users``.
        """
        said = getattr(self.current_user, "gpusched_admin", None)  # type: ignore[attr-defined]
        if said is not None:
            return bool(said)
        return self.username in self.settings.get("gpusched_admins", ())  # type: ignore[attr-defined]

    @property
    def viewer(self) -> Viewer:
        """Whom the answer is for: views of other users' jobs leave their private parts out."""
        return Viewer(self.username, self.is_admin())

    @property
    def mode(self) -> str:
        """Embedded (this server schedules), service (the lab's queue) or client."""
        return str(self.settings.get("gpusched_mode", "embedded"))  # type: ignore[attr-defined]

    @property
    def gate(self) -> LimitGate:
        """The per-user limits this server counts itself (rates, streams, uploads)."""
        return self.settings["gpusched_gate"]  # type: ignore[attr-defined,no-any-return]

    def caller_limits(self, sched: Any) -> UserLimits:
        """The limits that hold for the caller (their groups, whether an admin).

        Tells the scheduler who they are: its passes weigh their running jobs by these too.
        """
        mine: UserLimits | None = getattr(self, "_caller_limits", None)
        if mine is None:
            groups = frozenset(getattr(self.current_user, "groups", None) or ())  # type: ignore[attr-defined]
            admin, user = self.is_admin(), self.username
            if not sched.policy.limits.off:
                sched.note_caller(user, groups, admin)
            mine = sched.policy.limits.for_user(user, groups, admin)
            self._caller_limits, self._limits_sched = mine, sched
        return mine

    def live_files(self, user: str) -> Collection[str]:
        """The files the caller's jobs that have not ended name (what uploads are held for)."""
        sched = getattr(self, "_limits_sched", None)
        if sched is None:
            return ()
        live = [s for s in JobState if s not in TERMINAL_STATES]
        jobs, _ = sched.store.list_jobs(states=live, user=user, limit=None, shared=True)
        return {path for job in jobs for path in job.spec.files}

    def user_files_dir(self, user: str) -> str:
        """A user's private directory for files sent with requests (0700)."""
        return user_dir(self.settings["gpusched_data_dir"], user)  # type: ignore[attr-defined]

    def server_root(self) -> str:
        """The Jupyter server's root directory (paths in requests are relative to it)."""
        settings = self.settings  # type: ignore[attr-defined]
        root = getattr(settings.get("contents_manager"), "root_dir", None)
        return os.path.expanduser(str(root or settings.get("server_root_dir") or "."))

    def take_uploads(self, body: dict[str, Any]) -> PendingUploads | None:
        """Check the files sent with a job; the job stages them from the caller's directory.

        The lab-wide service cannot read paths on its callers' machines: there, ``files``
        must come as ``uploads`` (the user's own Jupyter server sends them that way). A
        server that reads them itself takes only paths inside its root (relative ones start
        there). Uploads come back checked but unwritten: the caller writes them once the job
        was checked too, and discards them if the request fails after all.
        """
        uploads = body.pop("uploads", None)
        if uploads is not None:
            if body.get("files"):
                raise InvalidSpecError("files", "give files or uploads, not both")
            folder = os.path.join(self.user_files_dir(self.username), "uploads")
            pending = check_uploads(uploads, folder)
            mine: UserLimits | None = getattr(self, "_caller_limits", None)
            if mine is not None:
                self.gate.uploads.check(mine, pending.size, lambda: self.live_files(mine.user))
            body["files"] = list(pending.tops)
            return pending
        if body.get("files") and self.mode == "service":
            raise InvalidSpecError(
                "files",
                "the lab's service cannot read paths on your machine; send the files' "
                "content as uploads (your Jupyter server does so for you)",
            )
        if body.get("files"):
            body["files"] = local_files(body["files"], self.server_root())
        return None

    def write_uploads(self, pending: PendingUploads) -> None:
        """Write checked uploads (:meth:`take_uploads`); removed if the request fails after all.

        See :meth:`ApiHandler.on_finish`.
        """
        pending.write()
        self._written_uploads = [*getattr(self, "_written_uploads", ()), pending.target]
        self.gate.uploads.fresh.add(pending.target)
        self.gate.uploads.added(self.username, pending.size)

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


def upload_size(uploads: Any) -> int:
    """Bytes ``uploads`` hold once decoded (base64: three bytes in four characters)."""
    if not isinstance(uploads, list):
        return 0
    return sum(
        len(item["content_base64"]) * 3 // 4
        for item in uploads
        if isinstance(item, dict) and isinstance(item.get("content_base64"), str)
    )


def job_id_arg(text: str) -> int:
    """A job id from the URL; anything that cannot be one is a 404 like an unknown id."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > MAX_ID:
        raise NotFoundError(f"job {text} does not exist; list jobs with GET gpusched/api/jobs")
    return int(text)


def _reject_constant(name: str) -> float:
    raise BadRequestError(f"{name} is not a number JSON allows; send a finite number")


class ApiHandler(GpuSchedMixin, APIHandler):
    """Base of the REST handlers: JSON in, JSON out."""

    async def prepare(self) -> None:  # type: ignore[override]
        """Refuse a body past ``GpuSchedApp.max_request_bytes``, saying the limit."""
        await super().prepare()
        limit = int(self.settings.get("gpusched_max_request_bytes", 96 << 20))
        size = len(self.request.body or b"")
        if size > limit:
            raise web.HTTPError(
                413,
                f"the request body is {format_size_bytes(size)}; at most "
                f"{format_size_bytes(limit)} (GpuSchedApp.max_request_bytes): stage big "
                "inputs as files",
            )

    def on_finish(self) -> None:
        """A request that failed leaves none of the files it uploaded behind."""
        written = getattr(self, "_written_uploads", ())
        for folder in written:
            self.gate.uploads.fresh.discard(folder)
            if self.get_status() >= 400:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                self.gate.uploads.answered.add(folder)
        if written and self.get_status() >= 400:
            self.gate.uploads.forget(self.username)
        super().on_finish()

    def set_secure_cookie(  # type: ignore[override]
        self, name: str, value: str | bytes, *args: Any, **kwargs: Any
    ) -> None:
        """Set no login cookie on a request that sent its credentials in a header.

        Jupyter signs one for every token-authenticated request without it; an API client
        (the CLI, the magic, a script) sends its token every time and never returns the
        cookie, and signing it was a tenth of a submit's server time. Browsers log in
        through Jupyter's own pages, which still set it.
        """
        if self.request.headers.get("Authorization"):
            return
        super().set_secure_cookie(name, value, *args, **kwargs)

    def json_body(self) -> Any:
        """The request body as JSON, or a 400 that says why it could not be read."""
        try:
            return json.loads(self.request.body or b"", parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            hint = f"the body is not valid JSON ({exc}); send a JSON object"
            raise BadRequestError(hint) from None
        except RecursionError:
            raise BadRequestError("the JSON body is nested too deeply") from None

    def write_model(self, body: BaseModel, status: int = 200) -> None:
        """Answer a response model (:mod:`jupyter_gpusched.core.api`) as JSON."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(body.model_dump_json())


class NoRouteHandler(ApiHandler):
    """Unknown paths under the API answer a JSON 404, like everything else here."""

    def _no_route(self, *args: Any) -> None:
        raise web.HTTPError(404)

    get = post = put = patch = delete = _no_route


def enum_arg(cls: Any, name: str, value: str) -> Any:
    """``value`` as a member of the enum ``cls``, or a 422 listing the allowed values."""
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise InvalidSpecError(name, f"{value!r} is not one of {allowed}") from None


ID = r"([^/]+)"  # checked in the handler, so a bad id is a JSON 404 like an unknown one
#: Last route of all (after plugin routes): unknown API paths answer a JSON 404.
NO_ROUTE: tuple[str, type] = (f"{API}/.*", NoRouteHandler)
