"""A server extension for ``bench/submit_breakdown.py``: the submit handler doing less.

Loaded beside jupyter_gpusched in a bench server only; ``GPUSCHED_BENCH_VARIANT`` says how
much of a submit ``POST jobs`` does, so the rates of the variants split a submit's cost:

- ``auth``: Jupyter's auth and authorization, then a fixed 201 answer;
- ``parse``: also reads the body, validates the spec and judges admission;
- ``commit``: also queues the job through the group commit and answers with its view, but
  the commit wakes no scheduling pass;
- ``real``: the handler as it is.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpusched.scheduling.scheduler import Scheduler
from jupyter_gpusched.server.handlers.jobs import JobsHandler

VARIANTS = ("auth", "parse", "commit", "real")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "_submit_variants"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    variant = os.environ.get("GPUSCHED_BENCH_VARIANT", "real")
    if variant not in VARIANTS:
        raise ValueError(f"GPUSCHED_BENCH_VARIANT must be one of {VARIANTS}, got {variant!r}")
    if variant == "real":
        return
    if variant == "commit":
        # Before the scheduler is built (on the loop, at start): its group commit keeps the
        # bound method it is given.
        Scheduler.wake = lambda self: None  # type: ignore[method-assign]
        Scheduler.wake_for_new = lambda self: None  # type: ignore[method-assign]

    @web.authenticated
    @authorized
    async def post(self: JobsHandler) -> None:
        if variant == "auth":
            self.set_status(201)
            self.set_header("Content-Type", "application/json")
            self.finish(b'{"id": 0}')
            return
        sched = await self.scheduler()
        spec = self._spec(self.json_body())
        sched._admit(spec)
        if variant == "parse":
            self.set_status(201)
            self.set_header("Content-Type", "application/json")
            self.finish(b'{"id": 0}')
            return
        job = await sched.submit_grouped(spec)
        self.write_model(sched.job_view(job, self.viewer), status=201)

    JobsHandler.post = post  # type: ignore[method-assign]
