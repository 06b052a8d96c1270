"""Clients whose answers get lost: a loopback proxy that drops them, and a retrying submitter.

``DroppingProxy`` sits between a client and a live server on the loopback: it forwards each
request, and for the next POSTs it is told to drop, waits until the server answered (the create
is committed by then), runs an optional step (kill -9 and restart the server) and closes the
client's connection without relaying the answer -- the client sees a connection error.

``retrying_submits`` is the retrying client of the chaos bench (``bench/chaos.py``) and of the
tests: it submits jobs through the project's API client (which retries a create with its
``Idempotency-Key``) while someone else kills the service, then counts what the store holds.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import create_engine, select

from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.core.errors import GpuSchedError
from jupyter_gpusched.store.orm import JobRow

#: The label that ties each job to the create that made it (see :func:`retrying_submits`).
SUBMIT_LABEL = "retrying_submit"


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``; ``url`` is the server via it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        self._lock = threading.Lock()
        self._drops = 0
        self._then: Callable[[], None] | None = None
        self.dropped = 0  # answers dropped so far
        self.posts = 0  # POST requests seen
        self._closed = False
        self._shut = threading.Event()  # set: new connections are closed at once
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="dropping-proxy").start()

    def drop_next_answers(self, count: int, then: Callable[[], None] | None = None) -> None:
        """Drop the answers to the next ``count`` POSTs, running ``then`` before each drop."""
        with self._lock:
            self._drops, self._then = count, then

    @contextlib.contextmanager
    def shut(self) -> Iterator[None]:
        """Close every connection made meanwhile at once, as a load balancer does while the
        server it fronts restarts (and answers 401 until its store is open, issue #31)."""
        self._shut.set()
        try:
            yield
        finally:
            self._shut.clear()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def __enter__(self) -> DroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        if self._shut.is_set():
            _close(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
        except OSError:  # the server is down: the client sees its connection closed
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.update((client, upstream))
        dropping = threading.Event()
        threading.Thread(
            target=self._requests, args=(client, upstream, dropping), daemon=True
        ).start()
        self._answers(upstream, client, dropping)

    def _requests(self, client: socket.socket, upstream: socket.socket, dropping: Any) -> None:
        """Client -> server; marks a POST whose answer is to be dropped before forwarding it."""
        while chunk := _recv(client):
            if chunk.startswith(b"POST "):
                with self._lock:
                    self.posts += 1
                    if self._drops > 0:
                        self._drops -= 1
                        dropping.set()
            try:
                upstream.sendall(chunk)
            except OSError:
                break
        _close(upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, dropping: Any) -> None:
        """Server -> client, until an answer to drop comes: then the connection is cut."""
        while chunk := _recv(upstream):
            if dropping.is_set():
                with self._lock:
                    then = self._then
                    self.dropped += 1
                if then is not None:
                    then()
                break
            try:
                client.sendall(chunk)
            except OSError:
                break
        _close(client)
        _close(upstream)
        with self._lock:
            self._sockets.difference_update((client, upstream))


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


# -- the retrying client of the chaos bench ---------------------------------------------------


@dataclass
class RetryingReport:
    """What :func:`retrying_submits` saw."""

    jobs: int  # creates asked for
    submitted: int = 0  # creates answered 201 (after retries)
    failed: list[str] = field(default_factory=list)  # creates that gave up, and why
    duplicates: int = 0  # jobs in the store beyond one per create
    missing: list[int] = field(default_factory=list)  # answered creates with no job stored
    ids: list[int] = field(default_factory=list)  # the job id each answered create got

    @property
    def clean(self) -> bool:
        """Every create answered, each made exactly one job."""
        return self.submitted == self.jobs and not self.duplicates and not self.missing


def retrying_submits(
    url: str,
    token: str,
    *,
    jobs: int,
    store_url: str,
    spec: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
    tag: str = "chaos",
    post_tries: int = 12,
) -> RetryingReport:
    """Submit ``jobs`` jobs one after another through :class:`GpuSchedClient`; count the store.

    Run it while the service at ``url`` is killed (kill -9) and restarted: the client retries
    each create with its ``Idempotency-Key`` when no answer comes (up to ``post_tries`` sends,
    waits doubling from 0.5 s to 10 s). Each job carries the label ``retrying_submit =
    "<tag>:<i>"``; afterwards the store at ``store_url`` is read directly, and every job beyond
    one per label is a duplicate. ``spec``: the job (a dict, or ``i -> dict``); default a
    zero-GPU ``true``.
    """
    client = GpuSchedClient(url, token, post_tries=post_tries, timeout_s=60.0)
    report = RetryingReport(jobs=jobs)
    for i in range(jobs):
        body = dict(spec(i) if callable(spec) else spec or {"kind": "script", "command": ["true"]})
        body.setdefault("gpus", 0)
        body["labels"] = {**body.get("labels", {}), SUBMIT_LABEL: f"{tag}:{i}"}
        try:
            report.ids.append(client.submit(body).id)
            report.submitted += 1
        except GpuSchedError as exc:
            report.failed.append(f"{i}: {exc.message}")
    per_label, ids = tagged_jobs(store_url, tag)
    report.duplicates = sum(n - 1 for n in per_label.values())
    report.missing = [job_id for job_id in report.ids if job_id not in ids]
    return report


def tagged_jobs(store_url: str, tag: str) -> tuple[Counter[str], set[int]]:
    """Jobs the store holds per ``retrying_submit`` label of ``tag``, and all their ids."""
    engine = create_engine(store_url)
    per_label: Counter[str] = Counter()
    ids: set[int] = set()
    try:
        with engine.connect() as conn:
            for job_id, spec in conn.execute(select(JobRow.id, JobRow.spec)):
                label = str((spec.get("labels") or {}).get(SUBMIT_LABEL, ""))
                if label.startswith(f"{tag}:"):
                    per_label[label] += 1
                    ids.add(job_id)
    finally:
        engine.dispose()
    return per_label, ids
