"""The server freezes the garbage collector's long-lived objects while its scheduler runs."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from _fixtures_server import ApiClient


@pytest.fixture
def gpusched_overrides() -> dict[str, Any]:
    return {"gc_freeze": True}


async def test_a_running_server_keeps_its_start_up_objects_out_of_full_collections(
    gpusched: ApiClient, jp_serverapp: Any
) -> None:
    app = next(
        e
        for e in jp_serverapp.extension_manager.extension_apps["jupyter_gpusched"]
        if getattr(e, "gc_freeze", None) is not None
    )
    assert app._gc is not None and app._gc._on_gc in gc.callbacks
    assert gc.get_freeze_count() > 50_000  # Jupyter, numpy, SQLAlchemy, ... frozen at start
    assert (await gpusched.json("GET", "cluster"))["nodes"]  # and it serves as ever
