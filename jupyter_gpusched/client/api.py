"""A small blocking client of the REST API, and how to find a running server.

Used by ``jupyter gpusched submit|queue|...`` and by the ``%gpu`` magic inside kernels. Only the
standard library for HTTP (so a kernel does not pay for more imports); the websocket of events
uses tornado, which every Jupyter install has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.core.units import format_duration_s

URL_ENV, TOKEN_ENV = "GPUSCHED_URL", "GPUSCHED_TOKEN"
API = "gpusched/api/"


class ApiError(GpuSchedError):
    """The server answered an error; ``error``, ``message`` and ``field`` come from its body."""

    def __init__(
        self, status: int, message: str, *, error: str = "HTTPError", field: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.field = field


class ServerNotFoundError(GpuSchedError):
    """No running Jupyter server with jupyter-gpusched could be found or reached."""


@dataclass(frozen=True)
class ServerInfo:
    """Where a server is: its URL (with base_url, ending in ``/``) and token."""

    url: str
    token: str = ""


def find_server(
    url: str | None = None,
    token: str | None = None,
    *,
    runtime_dir: str | None = None,
    timeout_s: float = 5.0,
) -> ServerInfo:
    """The server to talk to: given URL/token, else ``$GPUSCHED_URL``, else discovery.

    Discovery reads the running-server files (as ``jupyter server list`` does) and takes the
    first server that answers our API with the token it lists.
    """
    if url:
        return ServerInfo(_slash(url), token or "")
    if env_url := os.environ.get(URL_ENV):
        return ServerInfo(_slash(env_url), token or os.environ.get(TOKEN_ENV, ""))
    from jupyter_server.serverapp import list_running_servers

    tried = []
    for info in list_running_servers(runtime_dir):
        candidate = ServerInfo(_slash(info["url"]), token or info.get("token", ""))
        try:
            GpuSchedClient(candidate.url, candidate.token, timeout_s=timeout_s).list_jobs(limit=1)
        except GpuSchedError as exc:
            tried.append(f"{candidate.url} ({exc.message})")
            continue
        return candidate
    detail = f"; tried {', '.join(tried)}" if tried else ""
    raise ServerNotFoundError(
        "no running Jupyter server with jupyter-gpusched found"
        f"{detail}; start one with 'jupyter lab', or pass --url and --token "
        f"(or set {URL_ENV} and {TOKEN_ENV})"
    )


class GpuSchedClient:
    """Blocking calls, one per route; errors raise :class:`ApiError` with the server's words.

    Parameters
    ----------
    url
        The Jupyter server's URL including its base_url, e.g. ``http://localhost:8888/``.
    token
        The server's token ('' when the server has none).
    timeout_s
        Per-request timeout.
    """

    def __init__(self, url: str, token: str = "", *, timeout_s: float = 30.0) -> None:
        self.url = _slash(url)
        self.token = token
        self.timeout_s = timeout_s

    @classmethod
    def discover(cls, url: str | None = None, token: str | None = None) -> GpuSchedClient:
        """A client for the server :func:`find_server` picks."""
        info = find_server(url, token)
        return cls(info.url, info.token)

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        """Queue a job (JobSpec fields, without ``user``); the new job."""
        return self._json("POST", "jobs", body={**(spec or {}), **fields})

    def list_jobs(
        self,
        *,
        state: str | Iterable[str] | None = None,
        user: str | None = None,
        kind: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> dict[str, Any]:
        """``{"jobs": [...], "total", "limit", "offset"}``; ``user="me"`` for the caller."""
        if state is not None and not isinstance(state, str):
            state = ",".join(state)
        query = {"state": state, "user": user, "kind": kind, "limit": limit, "offset": offset}
        return self._json("GET", "jobs", query=query)

    def get_job(self, job_id: int) -> dict[str, Any]:
        """One job."""
        return self._json("GET", f"jobs/{int(job_id)}")

    def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancel a queued or running job; the cancelled job."""
        return self._json("DELETE", f"jobs/{int(job_id)}")

    def update(
        self, job_id: int, *, priority: str | None = None, held: bool | None = None
    ) -> dict[str, Any]:
        """Change priority class (``interactive``/``batch``) or hold/release a queued job."""
        body = {k: v for k, v in (("priority", priority), ("held", held)) if v is not None}
        return self._json("PATCH", f"jobs/{int(job_id)}", body=body)

    def read_log(self, job_id: int, *, offset: int = 0, limit: int = 65536) -> tuple[bytes, int]:
        """Log bytes from ``offset`` and the offset to ask for next."""
        query = {"offset": offset, "limit": limit}
        with self._open("GET", f"jobs/{int(job_id)}/log", query=query) as resp:
            data = resp.read()
            return data, int(resp.headers.get("X-Log-Offset", offset + len(data)))

    def follow_log(self, job_id: int, *, offset: int = 0) -> Iterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        query = {"offset": offset, "follow": 1}
        with self._open("GET", f"jobs/{int(job_id)}/log", query=query, timeout_s=None) as resp:
            while chunk := resp.read1(65536):
                yield chunk

    def wait(self, job_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict:
        """Block until the job finished (succeeded, failed or cancelled); the job."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job["state"] in ("succeeded", "failed", "cancelled"):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id} still {job['state']} after {format_duration_s(timeout_s)}"
                )
            time.sleep(poll_s)

    # -- leases, cluster, policy ---------------------------------------------------------------

    def leases(self, *, user: str | None = None) -> list[dict[str, Any]]:
        """My live leases (admins: ``user="all"`` or a name)."""
        return list(self._json("GET", "leases", query={"user": user})["leases"])

    def release(self, lease_id: int) -> dict[str, Any]:
        """Release a lease."""
        return self._json("DELETE", f"leases/{int(lease_id)}")

    def cluster(self) -> dict[str, Any]:
        """Nodes, GPUs, fragmentation figures, the window in force, queue size."""
        return self._json("GET", "cluster")

    def policy(self, at: str | None = None) -> dict[str, Any]:
        """The window at ``at`` (ISO time with zone; default now) and an explanation."""
        return self._json("GET", "policy", query={"at": at})

    async def events(self, *, after: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Scheduler events over the websocket, replaying stored ones newer than ``after``."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        ws_url = (
            "ws"
            + self.url[len("http") :]
            + API
            + "events?"
            + urllib.parse.urlencode({"after": after})
        )
        conn = await websocket_connect(HTTPRequest(ws_url, headers=self._headers()))
        try:
            while (message := await conn.read_message()) is not None:
                yield json.loads(message)
        finally:
            # close() only sends the close frame; tornado closes the socket once the server
            # answers (or 5 s later), on a loop that may end first (asyncio.run): the socket
            # would stay open. Wait for the answer (the end reads as None), then make sure.
            conn.close()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        while not conn.stream.closed() and await conn.read_message() is not None:
                            pass
            finally:
                conn.stream.close()  # a no-op once closed; else (cancelled, timed out) abort

    def call(
        self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        """Any JSON route under ``gpusched/api/`` (e.g. plugin routes such as ``notebooks``)."""
        return self._json(method, path, query=query, body=body)

    # -- plumbing ------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        timeout_s: float | None | bool = False,
    ) -> Any:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + API + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers()
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        timeout = self.timeout_s if timeout_s is False else timeout_s
        try:
            return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - http(s) only
        except urllib.error.HTTPError as err:
            with err:  # it holds the response (and its socket): read the body, then close
                raise _api_error(err) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServerNotFoundError(f"cannot reach {self.url}: {reason}") from None

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        with self._open(method, path, **kw) as resp:
            return json.loads(resp.read())


def _api_error(err: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(err.read())
        return ApiError(
            err.code,
            str(body["message"]),
            error=str(body.get("error", "")),
            field=body.get("field"),
        )
    except (ValueError, KeyError, TypeError):
        return ApiError(err.code, f"HTTP {err.code} {err.reason}")


def _slash(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ServerNotFoundError(f"{url!r} is not a server URL; write it like http://host:8888/")
    return url if url.endswith("/") else url + "/"
