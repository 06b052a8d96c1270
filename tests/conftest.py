"""Fixtures shared by every test module."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from jupyter_gpusched.clock import ManualClock

pytest_plugins = ["pytest_jupyter.jupyter_server", "_fixtures_server", "_fixtures_postgres"]


@pytest.fixture
def clock() -> ManualClock:
    """A clock that starts Monday 2026-11-23 09:00 UTC and moves only when told."""
    return ManualClock(datetime(2026, 11, 23, 9, 0, tzinfo=timezone.utc))
