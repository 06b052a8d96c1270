"""Fixtures shared by every test module, and the split of the suite into two sessions.

Tests under ``tests/inproc/`` drive an in-process Jupyter server through pytest-jupyter.
Once loaded, that plugin applies to the whole session: its hooks take over coroutine tests
(running them on its own event loop) and its autouse fixtures open and close a loop and
clean up a ServerApp around every test. The rest of the suite runs on pytest-asyncio's
loops (the simulated cluster, the scheduler), so the two are kept apart: ``make test`` runs
``tests/inproc`` in a session of its own (``pytest -p pytest_jupyter.jupyter_server
tests/inproc``), and a plain ``pytest`` skips it.
"""

from __future__ import annotations

import gc
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import patience

from jupyter_gpusched.core.clock import ManualClock

# Scenario helpers assert what a user should see: rewrite them for readable failures. Said
# here, before any test module imports one (directly or through another helper).
pytest.register_assert_rewrite(
    "_lab_scenarios", "_fixtures_failover", "_fixtures_hub", "_fixtures_users"
)

pytest_plugins = [
    "_fixtures_postgres",
    "_fixtures_server",
    "_fixtures_live_server",
    "_fixtures_slurm",
    "_fixtures_nodes",
]

_JUPYTER_PLUGIN = "pytest_jupyter.jupyter_server"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collect ``tests/inproc`` only in the session that loads pytest-jupyter, and only it."""
    with_jupyter = config.pluginmanager.has_plugin(_JUPYTER_PLUGIN)
    inproc = "inproc" in collection_path.relative_to(Path(__file__).parent).parts[:1]
    if collection_path.is_dir() and collection_path.name == "tests":
        return None
    if inproc != with_jupyter and collection_path.suffix == ".py":
        return True
    return None


#: Tests using these fixtures are marked ``slow``: a Jupyter server, a lab or a browser in a
#: subprocess, notebook kernels or the scheduler over real SSH on the simulated cluster, a fresh
#: node venv, PostgreSQL.
SLOW_FIXTURES = frozenset(
    {
        "live_server",
        "module_server",
        "server_process",
        "fuzz_server",
        "lab_server",
        "chromium",
        "nb_sim",
        "sim_harness",
        "node_python",
        "postgres_server_url",
    }
)
#: ...and so are tests with these markers (a browser, Debian's sshd, PostgreSQL).
SLOW_MARKERS = ("browser", "sshd", "postgres")


#: The modules that take longest, longest first (summed test times of a ``make test`` on 4
#: workers at load ~9; modules added since are placed by their slowest tests):
#: ``make test`` hands whole modules to its pytest-xdist workers (``--dist loadscope``: module
#: fixtures are set up once) in collection order, so these go out first and no worker is left
#: alone with a long module at the end. The others keep their order, after these.
LONGEST_FIRST = (
    "test_chaos.py",
    "test_gpu_kernel.py",
    "test_lab_panel.py",
    "test_store_writer.py",
    "test_service.py",
    "test_store_faults.py",
    "test_hub_service.py",
    "test_failover.py",
    "test_slurm_server.py",
    "test_notebooks.py",
    "test_hub_harness.py",
    "test_api_fuzz.py",
    "test_privacy_service.py",
    "test_service_startup.py",
    "test_idempotent_retries.py",
    "test_sshd_grace.py",
    "test_node_grace.py",
    "test_slow_clients.py",
    "test_lab_unit.py",
    "test_lab_gpu_kernel.py",
    "test_nbrun.py",
    "test_api_restart.py",
    "test_store_crash.py",
    "test_scheduler_sim.py",
    "test_run_as_owner.py",
    "test_second_user.py",
    "test_short_passes.py",
    "test_launching.py",
    "test_lab_limits.py",
    "test_cli_client.py",
    "test_magics.py",
    "inproc/test_api.py",
    "inproc/test_notebook_api.py",
    "inproc/test_limits.py",
    "inproc/test_clean_refusals.py",
    "inproc/test_kernels.py",
    "inproc/test_dropped_follows.py",
    "inproc/test_idempotency_api.py",
)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` what needs a slow peer, so ``pytest -m "not slow"`` is a fast inner loop;
    put the longest modules first (:data:`LONGEST_FIRST`)."""
    for item in items:
        needs = SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if needs or any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    here = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(here).as_posix(), len(rank)))


#: A hung test is still stopped within minutes on a loaded machine.
MAX_TIMEOUT_STRETCH = 3.0


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> object:
    """pytest-timeout's limit (``timeout`` in pyproject, or a test's marker), stretched by the
    machine's load when the test starts (at most 3x): the limit catches hangs, and on a box
    whose 2 cores run a second ``make test`` a test's work takes 3-5x as long as when quiet."""
    import pytest_timeout

    stretch = min(patience(), MAX_TIMEOUT_STRETCH)
    return pytest_timeout.pytest_timeout_set_timer(
        item, settings._replace(timeout=settings.timeout * stretch)
    )


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown, before pytest looks for leaks
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """With ``GPUSCHED_TEST_GC=1``, collect garbage after every test: a leaked resource (an
    unwaited subprocess, an unclosed socket) then fails the test that leaked it rather than
    whichever test happens to run when the collector finds it. Off by default (a collection per
    test costs CPU)."""
    if os.environ.get("GPUSCHED_TEST_GC"):
        gc.collect()


def pytest_report_header(config: pytest.Config) -> str:
    if config.pluginmanager.has_plugin(_JUPYTER_PLUGIN):
        return "gpusched: in-process Jupyter server tests (tests/inproc) only"
    return "gpusched: tests/inproc runs in its own session: make test runs both"


@pytest.fixture
def clock() -> ManualClock:
    """A clock that starts Monday 2026-11-23 09:00 UTC and moves only when told."""
    return ManualClock(datetime(2026, 11, 23, 9, 0, tzinfo=UTC))
