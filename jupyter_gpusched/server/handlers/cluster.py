"""Cluster routes: the map and fragmentation figures, the policy in force, the OpenAPI file."""

from __future__ import annotations

from datetime import datetime
from importlib import resources

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpusched.core.api import GpuHistory
from jupyter_gpusched.core.errors import InvalidSpecError
from jupyter_gpusched.scheduling.history import MAX_POINTS

from .base import API, ApiHandler, job_id_arg


class ClusterHandler(ApiHandler):
    """``GET cluster``: nodes, GPUs, fragmentation figures, the window in force, queue size."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The cluster map as the scheduler sees it now."""
        self.write_model((await self.scheduler()).cluster_view())


class HistoryHandler(ApiHandler):
    """``GET cluster/history``: GPUs' utilization, memory and power over time."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Samples per GPU, filtered by node, GPUs, job and time."""
        sched = await self.scheduler()
        gpus = None
        if (text := self.query("gpu")) is not None:
            try:
                gpus = [int(x) for x in text.split(",") if x.strip()]
            except ValueError:
                raise InvalidSpecError("gpu", f"{text!r}: write GPU indices like 0,1") from None
        job = self.query("job")
        history = sched.gpu_history
        self.write_model(
            GpuHistory(
                interval_s=sched.inventory_interval_s,
                kept_samples=history.keep,
                since=(since := self._time("since")),
                until=(until := self._time("until")),
                series=history.series(
                    node=self.query("node"),
                    gpus=gpus,
                    job_id=job_id_arg(job) if job is not None else None,
                    since=since,
                    until=until,
                    points=self.query_int("points", 500, 2, MAX_POINTS),
                ),
            )
        )

    def _time(self, name: str) -> datetime | None:
        text = self.query(name)
        return None if text is None else iso_arg(name, text)


class PolicyHandler(ApiHandler):
    """``GET policy?at=ISO``: which rules hold now (or at a given time), in words."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The policy window at ``at`` (default now), the limits (the caller's too), in words."""
        sched = await self.scheduler()
        text = self.query("at")
        at = None if text is None else iso_arg("at", text)
        self.write_model(sched.policy_view(at, self.caller_limits(sched)))


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


def iso_arg(name: str, text: str) -> datetime:
    """A query argument that must be an ISO 8601 time with a timezone."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidSpecError(name, f"{text!r} is not an ISO 8601 time") from None
    if at.tzinfo is None:
        raise InvalidSpecError(name, "needs a timezone, e.g. 2026-11-23T22:00:00+01:00")
    return at


handlers: list[tuple[str, type]] = [
    (f"{API}/cluster", ClusterHandler),
    (f"{API}/cluster/history", HistoryHandler),
    (f"{API}/policy", PolicyHandler),
    (f"{API}/openapi.yaml", SpecHandler),
]
