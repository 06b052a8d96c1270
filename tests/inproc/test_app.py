"""The extension's wiring: the backend class it builds, and its logs in the server's log."""

from __future__ import annotations

import io
import logging
from typing import TYPE_CHECKING, Any

import pytest

from jupyter_gpusched.cluster.ssh import SshBackend

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


class CountingBackend(SshBackend):
    """The SSH backend, remembering what the extension built it with."""

    built: list[dict[str, Any]] = []

    def __init__(self, nodes: Any, **kwargs: Any) -> None:
        super().__init__(nodes, **kwargs)
        CountingBackend.built.append({"nodes": [n.name for n in nodes], **kwargs})


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    return {"backend_class": CountingBackend}


async def test_the_configured_backend_class_serves_the_embedded_cluster(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    (built,) = CountingBackend.built[-1:]
    assert built["nodes"] == ["g0", "g1"] and built["inventory_interval_s"] == 5.0
    assert isinstance(jp_serverapp.web_app.settings["gpusched"].backend, CountingBackend)
    cluster = await gpusched.json("GET", "cluster")
    assert [n["name"] for n in cluster["nodes"]] == ["g0", "g1"]


async def test_package_logs_go_through_the_servers_log_at_its_level(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    level = jp_serverapp.log_level
    jp_serverapp.log_level = logging.ERROR  # as --log-level=ERROR: the server's handlers follow
    try:
        (console,) = jp_serverapp.log.handlers
        written = io.StringIO()
        console.setStream(written)
        log = logging.getLogger("jupyter_gpusched.scheduling.scheduler")
        log.warning("below the server's level")
        try:
            raise RuntimeError("node exploded")
        except RuntimeError:
            log.exception("gpusched: scheduler tick failed")
    finally:
        jp_serverapp.log_level = level
    text = written.getvalue()
    assert "below the server's level" not in text
    assert "gpusched: scheduler tick failed" in text
    assert "RuntimeError: node exploded" in text  # the traceback, in the server's format
    assert logging.getLogger("jupyter_gpusched").parent is jp_serverapp.log
