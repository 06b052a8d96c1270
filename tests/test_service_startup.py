"""While the lab-wide service starts, a valid token hears 503 + Retry-After, never 401 (#31, 6).

Seen before: the service answered before it had wired its store into token checks, so a valid
token read as unknown -- 17 to 24 401s per restart under a kill -9 storm, and a client that
believes a 401 drops a token that is fine. Here clients hammer a real service while it is
killed and restarted, and every answer is counted.
"""

from __future__ import annotations

import http.client
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import wait_for
from _fixtures_service import ServiceProcess

pytestmark = pytest.mark.slow

RESTARTS = 2


class Hammer:
    """Clients asking the service with one token as fast as it answers, counting answers."""

    def __init__(self, service: ServiceProcess, token: str, clients: int = 4) -> None:
        self.service = service
        self.token = token
        self.counts: Counter[int | str] = Counter()
        self.wrong: list[Any] = []  # answers other than 200 or 503 with Retry-After
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def __enter__(self) -> Hammer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def seen(self, status: int | str) -> int:
        with self._lock:
            return self.counts[status]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, body, headers = self.service.call(
                    "GET", "jobs?limit=1", token=self.token, timeout_s=30
                )
            except (OSError, http.client.HTTPException):  # URLError, refused, cut, timed out
                status, body, headers = "no answer", None, {}  # down between kill and listen
                self._stop.wait(0.05)  # no need to spin while nothing listens
            with self._lock:
                self.counts[status] += 1
                if status == 503 and int(headers.get("Retry-After", 0)) >= 1:
                    continue
                if status not in (200, "no answer"):
                    self.wrong.append((status, body))


def test_a_valid_token_hears_503_with_retry_after_and_never_401_while_the_service_restarts(
    tmp_path: Path,
) -> None:
    service = ServiceProcess(tmp_path).start()
    try:
        token = service.mint("alice")
        with Hammer(service, token) as hammer:
            for _ in range(RESTARTS):
                service.stop(signal.SIGKILL)
                answered = hammer.seen(200)
                service.start(wait=False)
                wait_for(
                    lambda: hammer.seen(200) > answered + 10,  # noqa: B023 (read at once)
                    timeout_s=120,
                    interval_s=0.1,
                    what="the restarted service to answer alice",
                )
        counts = dict(hammer.counts)
        assert hammer.wrong == [], (counts, hammer.wrong[:5])
        assert counts.get(401, 0) == 0, counts
        # the service was caught starting: valid tokens were told to come back, not refused
        assert counts.get(503, 0) >= 1, counts
    finally:
        service.stop()
