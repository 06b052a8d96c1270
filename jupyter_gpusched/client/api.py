"""A small blocking client of the REST API, and how to find a running server.

Used by ``jupyter gpusched submit|queue|...`` and by the ``%gpu`` magic inside kernels. Answers
come back as the API's own models (:mod:`jupyter_gpusched.core.api`), checked on arrival. Only
the standard library for HTTP and for finding the server (so a command or a kernel pays for no
more imports; connections are kept alive, :mod:`.transport`); the websocket of events uses
tornado, which every Jupyter install has.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, TypeVar

from pydantic import BaseModel

from jupyter_gpusched.client import transport
from jupyter_gpusched.client.rest import (
    API,
    KEY_HEADER,
    TOKEN_ENV,
    URL_ENV,
    ApiError,
    RestClient,
    ServerInfo,
    ServerNotFoundError,
    _api_error,
    find_server,
    running_servers,
)
from jupyter_gpusched.core.api import (
    ArrayCancelled,
    ArrayTask,
    ArrayView,
    Cluster,
    Definition,
    DefinitionList,
    EventMessage,
    GpuHistory,
    JobArray,
    JobEvents,
    JobList,
    JobView,
    LeaseKernel,
    LeaseList,
    NotebookSubmitted,
    PolicyView,
)
from jupyter_gpusched.core.models import JobSubmission
from jupyter_gpusched.core.units import format_duration_s

M = TypeVar("M", bound=BaseModel)

__all__ = [  # where the server is and the errors: from .rest, here too for every caller
    "API",
    "KEY_HEADER",
    "TOKEN_ENV",
    "URL_ENV",
    "ApiError",
    "GpuSchedClient",
    "ServerInfo",
    "ServerNotFoundError",
    "find_server",
    "running_servers",
]


class GpuSchedClient(RestClient):
    """Blocking calls, one per route; errors raise :class:`ApiError` with the server's words.

    Parameters
    ----------
    url
        The Jupyter server's URL including its base_url, e.g. ``http://localhost:8888/``.
    token
        The server's token ('' when the server has none).
    timeout_s
        Per-request timeout.
    post_tries
        How often a create (a ``POST``) is sent, with one ``Idempotency-Key``, when no answer
        came (the connection broke, the server restarts) or the server said to try again
        (502, 503, or 409 while the first try is still answered); the waits between tries
        double from ``retry_backoff_s`` (a ``Retry-After`` is honoured up to ``max_wait_s``).
        The server answers a repeat with what the first try made: never a second job.
    """

    @classmethod
    def discover(cls, url: str | None = None, token: str | None = None) -> GpuSchedClient:
        """A client for the server :func:`find_server` picks."""
        info = find_server(url, token)
        return cls(info.url, info.token)

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, spec: JobSubmission | dict[str, Any] | None = None, **fields: Any) -> JobView:
        """Queue a job (JobSpec fields, without ``user``); the new job."""
        if isinstance(spec, BaseModel):
            spec = spec.model_dump(mode="json", exclude_unset=True)
        return self._model(JobView, "POST", "jobs", body={**(spec or {}), **fields})

    def submit_array(
        self, count: int, spec: JobSubmission | dict[str, Any] | None = None, **fields: Any
    ) -> JobArray:
        """Queue ``count`` copies of a job as one array (``$GPUSCHED_ARRAY_INDEX`` tells each)."""
        if isinstance(spec, BaseModel):
            spec = spec.model_dump(mode="json", exclude_unset=True)
        body = {**(spec or {}), **fields, "array": count}
        return self._model(JobArray, "POST", "jobs", body=body)

    def submit_many(self, specs: Iterable[JobSubmission | dict[str, Any]]) -> JobArray:
        """Queue several jobs in one request (one transaction: all or none)."""
        body = [
            s.model_dump(mode="json", exclude_unset=True) if isinstance(s, BaseModel) else s
            for s in specs
        ]
        return self._model(JobArray, "POST", "jobs", body=body)

    def list_jobs(
        self,
        *,
        state: str | Iterable[str] | None = None,
        user: str | None = None,
        kind: str | None = None,
        array: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> JobList:
        """One page of jobs, oldest first; ``user="me"`` for the caller's."""
        if state is not None and not isinstance(state, str):
            state = ",".join(state)
        query = {"state": state, "user": user, "kind": kind, "array": array}
        query.update(limit=limit, offset=offset)
        return self._model(JobList, "GET", "jobs", query=query)

    def get_array(self, array_id: int) -> ArrayView:
        """An ``array: N`` submit: size, pending range, its tasks' counts by state."""
        return self._model(ArrayView, "GET", f"arrays/{int(array_id)}")

    def array_task(self, array_id: int, index: int) -> ArrayTask:
        """Task ``index`` of an array (``ID_7``): its job once made, or that it waits."""
        return self._model(ArrayTask, "GET", f"arrays/{int(array_id)}/tasks/{int(index)}")

    def cancel_array(self, array_id: int) -> ArrayCancelled:
        """Cancel a whole array: its pending tasks and its live tasks' jobs."""
        return self._model(ArrayCancelled, "DELETE", f"arrays/{int(array_id)}")

    def cancel_array_task(self, array_id: int, index: int) -> ArrayTask:
        """Cancel one task of an array; a pending one never starts."""
        return self._model(ArrayTask, "DELETE", f"arrays/{int(array_id)}/tasks/{int(index)}")

    def get_job(self, job_id: int) -> JobView:
        """One job."""
        return self._model(JobView, "GET", f"jobs/{int(job_id)}")

    def cancel(self, job_id: int) -> JobView:
        """Cancel a queued or running job; the cancelled job."""
        return self._model(JobView, "DELETE", f"jobs/{int(job_id)}")

    def update(
        self, job_id: int, *, priority: str | None = None, held: bool | None = None
    ) -> JobView:
        """Change priority class (``interactive``/``batch``) or hold/release a queued job."""
        body = {k: v for k, v in (("priority", priority), ("held", held)) if v is not None}
        return self._model(JobView, "PATCH", f"jobs/{int(job_id)}", body=body)

    def read_log(self, job_id: int, *, offset: int = 0, limit: int = 65536) -> tuple[bytes, int]:
        """Log bytes from ``offset`` and the offset to ask for next."""
        query = {"offset": offset, "limit": limit}
        answer = self._call("GET", f"jobs/{int(job_id)}/log", query=query)
        data = answer.body
        return data, int(answer.headers.get("x-log-offset", offset + len(data)))

    def follow_log(self, job_id: int, *, offset: int = 0) -> Iterator[bytes]:
        """Log bytes as they are written, until the job ends."""
        query = {"offset": offset, "follow": 1}
        with self._stream(f"jobs/{int(job_id)}/log", query) as resp:
            while chunk := resp.read1(65536):
                yield chunk

    def job_events(self, job_id: int) -> JobEvents:
        """The job's timeline: state changes with reasons, oldest first."""
        return self._model(JobEvents, "GET", f"jobs/{int(job_id)}/events")

    def wait(self, job_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> JobView:
        """Block until the job finished (succeeded, failed or cancelled); the job."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job.state in ("succeeded", "failed", "cancelled"):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id} still {job.state.value} after {format_duration_s(timeout_s)}"
                )
            time.sleep(poll_s)

    # -- leases, cluster, policy ---------------------------------------------------------------

    def leases(self, *, user: str | None = None) -> list[JobView]:
        """My live leases (admins: ``user="all"`` or a name)."""
        return self._model(LeaseList, "GET", "leases", query={"user": user}).leases

    def release(self, lease_id: int) -> JobView:
        """Release a lease."""
        return self._model(JobView, "DELETE", f"leases/{int(lease_id)}")

    def lease_kernel(self, lease_id: int) -> LeaseKernel:
        """How to reach a running lease's kernel (counts as activity on the lease)."""
        return self._model(LeaseKernel, "GET", f"leases/{int(lease_id)}/kernel")

    def cluster(self) -> Cluster:
        """Nodes, GPUs, fragmentation figures, the window in force, queue size."""
        return self._model(Cluster, "GET", "cluster")

    def gpu_history(
        self,
        *,
        node: str | None = None,
        gpus: Iterable[int] | None = None,
        job: int | None = None,
        points: int = 500,
    ) -> GpuHistory:
        """GPUs' utilization, memory and power over time (``job``: its GPUs over its life)."""
        query = {
            "node": node,
            "gpu": None if gpus is None else ",".join(map(str, gpus)),
            "job": job,
            "points": points,
        }
        return self._model(GpuHistory, "GET", "cluster/history", query=query)

    def policy(self, at: str | None = None) -> PolicyView:
        """The window at ``at`` (ISO time with zone; default now) and an explanation."""
        return self._model(PolicyView, "GET", "policy", query={"at": at})

    async def events(self, *, after: int = 0) -> AsyncIterator[EventMessage]:
        """Scheduler events over the websocket, replaying stored ones newer than ``after``."""
        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.websocket import websocket_connect

        ws_url = (
            "ws"
            + self.url[len("http") :]
            + API
            + "events?"
            + urllib.parse.urlencode({"after": after})
        )
        try:
            conn = await websocket_connect(HTTPRequest(ws_url, headers=self._headers()))
        except HTTPClientError as err:  # refused before the upgrade (a 429 over the streams)
            if err.response is None:
                raise
            headers = {k.lower(): v for k, v in err.response.headers.get_all()}
            answer = transport.Answer(err.code, err.message or "", headers, err.response.body)
            raise _api_error(answer) from None
        try:
            while (message := await conn.read_message()) is not None:
                yield EventMessage.model_validate_json(message)
        finally:
            await close_websocket(conn)

    # -- notebooks and definitions -------------------------------------------------------------

    def submit_notebook(self, notebook: str, **fields: Any) -> NotebookSubmitted:
        """Run a notebook now, later, or (a cron ``at``) on a schedule.

        ``notebook`` is a path under the server's root (absolute paths inside it work too);
        ``fields`` are the other request fields (parameters, at, gpus, ...).
        """
        body = {"notebook": notebook, **fields}
        return self._model(NotebookSubmitted, "POST", "notebooks", body=body)

    def list_definitions(
        self, *, user: str | None = None, limit: int = 1000, offset: int = 0
    ) -> DefinitionList:
        """One page of recurring notebook jobs (``user="me"`` for the caller's)."""
        query = {"user": user, "limit": limit, "offset": offset}
        return self._model(DefinitionList, "GET", "definitions", query=query)

    def get_definition(self, definition_id: int) -> Definition:
        """One definition with its latest firings."""
        return self._model(Definition, "GET", f"definitions/{int(definition_id)}")

    def update_definition(self, definition_id: int, **changes: Any) -> Definition:
        """Change ``paused``, ``schedule``, ``timezone``, ``catch_up`` or ``name``."""
        path = f"definitions/{int(definition_id)}"
        return self._model(Definition, "PATCH", path, body=changes)

    def delete_definition(self, definition_id: int) -> Definition:
        """Delete a definition (the jobs it made stay)."""
        return self._model(Definition, "DELETE", f"definitions/{int(definition_id)}")

    # -- plumbing ------------------------------------------------------------------------------

    def _stream(self, path: str, query: dict[str, Any]) -> Any:
        """A response to read as it comes (a connection of its own, closed with it)."""
        req = urllib.request.Request(self._url(path, query), headers=self._headers())
        try:
            return urllib.request.build_opener().open(req)  # the environment's proxies now
        except urllib.error.HTTPError as err:
            with err:  # it holds the response (and its socket): read the body, then close
                headers = {k.lower(): v for k, v in err.headers.items()}
                raise _api_error(
                    transport.Answer(err.code, str(err.reason), headers, err.read())
                ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServerNotFoundError(f"cannot reach {self.url}: {reason}") from None

    def _model(self, model: type[M], method: str, path: str, **kw: Any) -> M:
        return model.model_validate_json(self._call(method, path, **kw).body)


async def close_websocket(conn: Any, timeout_s: float = 5.0) -> None:
    """Close a client websocket (tornado's) and wait until its socket is closed.

    ``close()`` only sends the close frame; tornado closes the socket once the server answers
    (or 5 s later), on a loop that may end first (``asyncio.run``): the socket would stay open.
    Wait for the answer (the end reads as None), then make sure.
    """
    conn.close()
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not conn.stream.closed() and await conn.read_message() is not None:
                    pass
    finally:
        conn.stream.close()  # a no-op once closed; else (cancelled, timed out) abort
