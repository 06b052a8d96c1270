"""Where the server is and how one request goes to it: the REST client's standard-library part.

Split from :mod:`.api` (which adds the answers as the API's pydantic models) so that the quick
``jupyter gpusched queue`` (:mod:`jupyter_gpusched.cli.quick`) finds the server and asks it the
same way as every other client, without importing pydantic: the same discovery
(``$GPUSCHED_URL``, the running-server files), the same errors, the same kept connection.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from jupyter_gpusched.client import transport
from jupyter_gpusched.core.errors import GpuSchedError

URL_ENV, TOKEN_ENV = "GPUSCHED_URL", "GPUSCHED_TOKEN"
#: The header a create's key travels in (the IETF httpapi draft's name).
KEY_HEADER = "Idempotency-Key"
API = "gpusched/api/"


class ApiError(GpuSchedError):
    """The server answered an error; ``error``, ``message`` and ``field`` come from its body.

    ``retry_after_s``: when the server said to try again (``Retry-After`` of a 429 over a
    limit, or a 503). The client repeats only creates, with their idempotency key
    (:meth:`GpuSchedClient._call`); a 429 never.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error: str = "HTTPError",
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.field = field
        self.retry_after_s = retry_after_s


class ServerNotFoundError(GpuSchedError):
    """No running Jupyter server with jupyter-gpusched could be found or reached."""


@dataclass(frozen=True)
class ServerInfo:
    """Where a server is: its URL (with base_url, ending in ``/``) and token."""

    url: str
    token: str = ""


def running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """The running Jupyter servers' files (``jpserver-*.json``), as ``jupyter server list``.

    Read directly, not through jupyter_server, so a command starts without importing it.
    Files of servers whose process is gone are skipped.
    """
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(runtime_dir), "jpserver-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue  # being written or removed
        if isinstance(info, dict) and "url" in info and _alive(info.get("pid")):
            found.append(info)
    return found


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return True  # cannot tell: let the request say
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's server
    return True


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
    tried, behind = [], []
    for info in running_servers(runtime_dir):
        candidate = ServerInfo(_slash(info["url"]), token or info.get("token", ""))
        try:
            RestClient(candidate.url, candidate.token, timeout_s=timeout_s).get_json(
                "jobs", {"limit": 1}
            )
        except GpuSchedError as exc:
            tried.append(f"{candidate.url} ({exc.message})")
            if isinstance(exc, ApiError) and exc.status in (502, 503, 504):
                behind.append(f"the Jupyter server at {candidate.url} runs, but {exc.message}")
            continue
        return candidate
    if behind:  # the server is there: starting another would not help; what is down is not it
        what = (
            "the lab's service ('jupyter gpusched service', or ask whoever runs it)"
            if any("service" in b for b in behind)
            else "what it names"
        )
        raise ServerNotFoundError(f"{'; '.join(behind)}; start {what}, then try again")
    detail = f"; tried {', '.join(tried)}" if tried else ""
    raise ServerNotFoundError(
        "no running Jupyter server with jupyter-gpusched found"
        f"{detail}; start one with 'jupyter lab', or pass --url and --token "
        f"(or set {URL_ENV} and {TOKEN_ENV})"
    )


class RestClient:
    """One request at a time to the API, answers as bytes or JSON; errors raise :class:`ApiError`.

    The parameters are :class:`~jupyter_gpusched.client.api.GpuSchedClient`'s.
    """

    def __init__(
        self,
        url: str,
        token: str = "",
        *,
        timeout_s: float = 30.0,
        post_tries: int = 6,
        retry_backoff_s: float = 0.5,
        max_wait_s: float = 10.0,
    ) -> None:
        self.url = _slash(url)
        self.token = token
        self.timeout_s = timeout_s
        self.post_tries = max(1, post_tries)
        self.retry_backoff_s = retry_backoff_s
        self.max_wait_s = max_wait_s

    def get_json(self, path: str, query: dict[str, Any] | None = None) -> Any:
        """``GET path`` and its JSON body, as plain data."""
        return json.loads(self._call("GET", path, query=query).body)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def _url(self, path: str, query: dict[str, Any] | None) -> str:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        return self.url + API + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _call(
        self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None
    ) -> transport.Answer:
        """One request on this thread's kept connection; an error status raises ApiError.

        A ``POST`` creates: it carries a fresh ``Idempotency-Key`` and is sent again with it
        while no answer comes (see ``post_tries``).
        """
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers()
        if data is not None:
            headers["Content-Type"] = "application/json"
        tries = 1
        if method == "POST":
            import uuid  # only creates carry a key: a GET pays nothing for it

            headers[KEY_HEADER] = f'"{uuid.uuid4()}"'  # one per create, kept by its repeats
            tries = self.post_tries
        url = self._url(path, query)
        wait_s = self.retry_backoff_s
        for attempt in range(1, tries + 1):
            try:
                answer = transport.request(
                    method, url, body=data, headers=headers, timeout=self.timeout_s
                )
            except transport.Unreachable as err:
                if attempt == tries:
                    raise ServerNotFoundError(f"cannot reach {self.url}: {err}") from None
                import random  # only when retrying: one GET pays nothing for it

                time.sleep(wait_s * random.uniform(0.8, 1.2))
                wait_s *= 2
                continue
            if attempt < tries and _try_again(answer):
                said = _api_error(answer).retry_after_s
                time.sleep(min(self.max_wait_s, said if said is not None else wait_s))
                wait_s *= 2
                continue
            break
        if answer.status >= 400:
            raise _api_error(answer)
        return answer


def _try_again(answer: transport.Answer) -> bool:
    """Whether a create's answer says to send it again (with its key): nothing was decided.

    502: a user's server could not reach the lab's service; 503: the service is starting or
    its store is away; 409 ``InFlightError``: the first try is still being answered.
    """
    if answer.status in (502, 503):
        return True
    return answer.status == 409 and _api_error(answer).error == "InFlightError"


def _api_error(answer: transport.Answer) -> ApiError:
    retry_s = None
    with contextlib.suppress(ValueError, TypeError):
        retry_s = float(answer.headers["retry-after"]) if "retry-after" in answer.headers else None
    try:
        body = json.loads(answer.body)
        return ApiError(
            answer.status,
            str(body["message"]),
            error=str(body.get("error", "")),
            field=body.get("field"),
            retry_after_s=retry_s,
        )
    except (ValueError, KeyError, TypeError):
        return ApiError(
            answer.status, f"HTTP {answer.status} {answer.reason}", retry_after_s=retry_s
        )


def _slash(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ServerNotFoundError(f"{url!r} is not a server URL; write it like http://host:8888/")
    return url if url.endswith("/") else url + "/"
