"""Cluster routes: the map and fragmentation figures, the policy in force, the OpenAPI file."""

from __future__ import annotations

from datetime import datetime
from importlib import resources

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_gpusched.core.errors import InvalidSpecError

from .base import API, ApiHandler


class ClusterHandler(ApiHandler):
    """``GET cluster``: nodes, GPUs, fragmentation figures, the window in force, queue size."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The cluster map as the scheduler sees it now."""
        self.write_model((await self.scheduler()).cluster_view())


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
        self.write_model(sched.policy_view(at))


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


handlers: list[tuple[str, type]] = [
    (f"{API}/cluster", ClusterHandler),
    (f"{API}/policy", PolicyHandler),
    (f"{API}/openapi.yaml", SpecHandler),
]
