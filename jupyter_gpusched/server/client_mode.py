"""Client mode: a user's Jupyter server forwards the gpusched API to the lab-wide service.

When ``c.GpuSchedApp.service_url`` is set (or, under JupyterHub, a ``gpusched`` service is
registered with the Hub), the extension runs no scheduler. Its ``/gpusched/api/*`` routes, the
events websocket and log follows are forwarded to the service with this server's user's
identity: their Hub token (``JUPYTERHUB_API_TOKEN`` of the single-user server) or the token
the service minted for them (``c.GpuSchedApp.service_token``). The panel, widgets, magics and
CLI talk to their own server exactly as in single-user mode.

What only this server can do happens here before forwarding: files and notebooks named by
path are read from this server's root (and only from inside it) and sent along as content, and
executed notebooks the service keeps are copied back beside their input (:mod:`.outputs`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler
from tornado import httpclient, web, websocket
from tornado.iostream import IOStream, StreamClosedError

from jupyter_gpusched.core.errors import BadRequestError, TooManyError

from . import relay
from .handlers.base import API, GpuSchedMixin
from .handlers.events import ListenOnlyWebSocket
from .idempotency import HEADER as KEY_HEADER
from .idempotency import REPLAYED_HEADER, parse_key
from .uploads import inline_files, inline_notebook

#: Headers of the service's answers passed on to the caller.
_PASS_HEADERS = (
    "Content-Type",
    "X-Log-Offset",
    "Retry-After",
    "WWW-Authenticate",
    REPLAYED_HEADER,
)
#: Longest a forwarded request (not a follow) may take.
_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServiceLink:
    """Where the lab-wide service is, and the token this server speaks for its user with."""

    url: str  # the service's base URL, ending in "/"
    token: str

    def api_url(self, path: str, query: str = "") -> str:
        """The service's URL for ``gpusched/api/<path>?<query>``."""
        url = f"{self.url}{API}/{path}"
        return f"{url}?{query}" if query else url

    def ws_url(self, path: str, query: str = "") -> str:
        """The websocket URL of an API path."""
        parts = urlsplit(self.api_url(path, query))
        scheme = "wss" if parts.scheme == "https" else "ws"
        return urlunsplit((scheme, *parts[1:]))

    def headers(self) -> dict[str, str]:
        """Authorization of this server's user."""
        return {"Authorization": f"token {self.token}"}


def hub_service_link(name: str = "gpusched") -> ServiceLink | None:
    """The service registered with this server's JupyterHub under ``name``, if any.

    Asks the Hub API (``JUPYTERHUB_API_URL``) with this single-user server's own token, so it
    works only inside a Hub-spawned server whose token may read the service.
    """
    api_url = os.environ.get("JUPYTERHUB_API_URL")
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    if not name or not api_url or not token:
        return None
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"{api_url.rstrip('/')}/services/{name}", headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            model = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    base = model.get("url") or ""
    prefix = model.get("prefix") or f"/services/{name}/"
    if not base:
        return None
    return ServiceLink(f"{base.rstrip('/')}/{prefix.strip('/')}/", token)


class _Forwarding(GpuSchedMixin):
    """What the forwarding handlers share: the link to the service."""

    @property
    def link(self) -> ServiceLink:
        return self.settings["gpusched_link"]  # type: ignore[attr-defined,no-any-return]


class ForwardHandler(_Forwarding, APIHandler):
    """Every REST route: the same request to the service, its answer back as it came."""

    _upstream: IOStream | None = None  # a follow's own connection to the service
    _gone = False  # our caller went away

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        """Forward a read (a log follow streams until the service ends it, or the caller goes)."""
        if path.endswith("/log") and self.query_bool("follow"):
            await self._follow(path)
        else:
            await self._forward("GET", path, None)

    async def _follow(self, path: str) -> None:
        url = self.link.api_url(path, self.request.query)
        try:
            self._upstream = await relay.connect(url)
            if self._gone:
                return
            await relay.relay_get(self._upstream, url, self.link.headers(), self, _PASS_HEADERS)
        except (OSError, StreamClosedError) as exc:
            if self._gone or self._headers_written:
                return  # our caller went (the service's follow ends with it), or the service did
            raise web.HTTPError(
                502, f"the lab's gpusched service at {self.link.url} is unreachable: {exc}"
            ) from None
        finally:
            if self._upstream is not None:
                self._upstream.close()
        if not self._gone:
            self.finish()

    def on_connection_close(self) -> None:
        """Our caller went away: close the follow's connection, ending it at the service."""
        self._gone = True
        if self._upstream is not None:
            self._upstream.close()
        super().on_connection_close()

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        """Forward a create, first turning file and notebook paths into their content."""
        body = self.request.body
        if path in ("jobs", "notebooks", "definitions") and body:
            body = self._inline(path, body)
        await self._forward("POST", path, body)

    @web.authenticated
    @authorized
    async def patch(self, path: str) -> None:
        """Forward a change."""
        await self._forward("PATCH", path, self.request.body)

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        """Forward a cancel or delete."""
        await self._forward("DELETE", path, None)

    def _inline(self, path: str, body: bytes) -> bytes:
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return body  # the service answers with the precise 400
        root = self.server_root()
        if path == "jobs":
            items = data if isinstance(data, list) else [data]
            for item in items:
                if isinstance(item, dict):
                    inline_files(item, root)
        elif isinstance(data, dict):
            inline_notebook(data, root)
        return json.dumps(data).encode()

    async def _forward(self, method: str, path: str, body: bytes | None) -> None:
        headers = {**self.link.headers()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if keys := self.request.headers.get_list(KEY_HEADER):
            parse_key(keys)  # a malformed key is refused here, as the service would
            headers[KEY_HEADER] = keys[0]
        request = httpclient.HTTPRequest(
            self.link.api_url(path, self.request.query),
            method=method,
            headers=headers,
            body=body if method in ("POST", "PATCH", "PUT") else None,
            request_timeout=_TIMEOUT_S,
            follow_redirects=False,
            allow_nonstandard_methods=True,
        )
        client = httpclient.AsyncHTTPClient()
        try:
            response = await client.fetch(request, raise_error=False)
        except (OSError, httpclient.HTTPClientError) as exc:
            raise web.HTTPError(
                502, f"the lab's gpusched service at {self.link.url} is unreachable: {exc}"
            ) from None
        if response.code == 599:
            raise web.HTTPError(
                502, f"the lab's gpusched service at {self.link.url} is unreachable: "
                f"{response.error}"
            )  # fmt: skip
        self.set_status(response.code)
        for name in _PASS_HEADERS:
            if name in response.headers:
                self.set_header(name, response.headers[name])
        if "Location" in response.headers:
            self.set_header("Location", self._local_location(response.headers["Location"]))
        self.finish(response.body or b"")

    def _local_location(self, location: str) -> str:
        """The service's ``.../gpusched/api/jobs/5`` as this server's own URL of it."""
        marker = f"/{API}/"
        if marker not in location:
            return location
        rest = location.split(marker, 1)[1]
        return f"{self.base_url.rstrip('/')}/{API}/{rest}"  # type: ignore[attr-defined]

    def write_error(self, status_code: int, **kwargs: Any) -> None:  # noqa: D102
        GpuSchedMixin.write_error(self, status_code, **kwargs)


class EventsForwardHandler(_Forwarding, ListenOnlyWebSocket):
    """The events websocket, relayed from the service's."""

    _upstream: websocket.WebSocketClientConnection | None = None

    @ws_authenticated
    @authorized
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Open the service's websocket first, then upgrade this one."""
        request = httpclient.HTTPRequest(
            self.link.ws_url("events", self.request.query), headers=self.link.headers()
        )
        try:
            self._upstream = await websocket.websocket_connect(request)
        except httpclient.HTTPClientError as exc:
            if exc.code == 429:  # over the user's streams at the service: say so, as it did
                raise refused_upstream(exc) from None
            raise web.HTTPError(
                502, f"the lab's gpusched service at {self.link.url} is unreachable: {exc}"
            ) from None
        except OSError as exc:
            raise web.HTTPError(
                502, f"the lab's gpusched service at {self.link.url} is unreachable: {exc}"
            ) from None
        await super().get(*args, **kwargs)

    async def relay(self) -> AsyncIterator[str | bytes]:  # type: ignore[override]
        """The service's messages as they come."""
        assert self._upstream is not None
        while (message := await self._upstream.read_message()) is not None:
            yield message
        if self.ws_connection is not None:  # the service hung up: say why it did (1008...)
            self.close(self._upstream.close_code, self._upstream.close_reason)

    def stopped(self) -> None:
        """Close the service's side too."""
        if self._upstream is not None:
            self._upstream.close()


def refused_upstream(exc: httpclient.HTTPClientError) -> TooManyError:
    """The service's 429 (its message and ``Retry-After``) as this server's own."""
    response = exc.response
    message, retry_s = "the lab's gpusched service refused: too many at once", 5.0
    if response is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            message = str(json.loads(response.body)["message"])
        with contextlib.suppress(ValueError, TypeError):
            retry_s = float(response.headers.get("Retry-After", retry_s))
    return TooManyError(message, retry_after_s=retry_s)


def check_link(link: ServiceLink) -> None:
    """Refuse a service URL that cannot be one, at start rather than at the first call."""
    parts = urlsplit(link.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadRequestError(
            f"GpuSchedApp.service_url {link.url!r} is not an http(s) URL like "
            "http://gpu-head:10101/"
        )


handlers: list[tuple[str, type]] = [
    (f"{API}/events", EventsForwardHandler),
    (f"{API}/(.*)", ForwardHandler),
]
