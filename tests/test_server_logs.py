"""The server's logger is raised to what its handlers show, and what they show is unchanged."""

from __future__ import annotations

import io
import logging

import pytest

from jupyter_gpusched.server.logs import match_level_to_handlers, shown_level


def app_log(name: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger as traitlets sets an app's up: DEBUG itself, WARNING at its one handler.

    Made inside the test: pytest's capture adds its handlers to the loggers there before.
    """
    log = logging.getLogger(f"gpusched-test.{name}")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setLevel(logging.WARNING)
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log, out


def test_debug_calls_build_no_record_when_no_handler_shows_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, out = app_log("quiet")
    built: list[logging.LogRecord] = []
    real = log.makeRecord
    monkeypatch.setattr(log, "makeRecord", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    log.debug("200 POST /api/gpusched/jobs")
    assert len(built) == 1  # traitlets' setup: built, then dropped by the handler

    match_level_to_handlers(log)
    log.debug("200 POST /api/gpusched/jobs")
    log.info("not shown either")
    log.warning("shown")
    assert len(built) == 2  # only the warning
    assert out.getvalue() == "shown\n"


def test_a_handler_that_shows_debug_keeps_the_logger_at_debug() -> None:
    log, _ = app_log("verbose")
    verbose = logging.StreamHandler(io.StringIO())  # a log file at DEBUG, say
    verbose.setLevel(logging.DEBUG)
    log.addHandler(verbose)
    try:
        match_level_to_handlers(log)
        assert log.level == logging.DEBUG
    finally:
        log.removeHandler(verbose)


def test_handlers_of_parents_count_while_records_propagate() -> None:
    parent = logging.getLogger("gpusched-test-parent")
    child = logging.getLogger("gpusched-test-parent.child")
    everything = logging.StreamHandler(io.StringIO())  # level NOTSET: shows all
    parent.addHandler(everything)
    try:
        assert shown_level(child) == logging.NOTSET
        child.propagate = False
        assert shown_level(child) == logging.WARNING  # no handler: logging's last resort
    finally:
        parent.removeHandler(everything)
        child.propagate = True


def test_the_level_is_never_lowered() -> None:
    log, _ = app_log("errors")
    log.setLevel(logging.ERROR)
    match_level_to_handlers(log)
    assert log.level == logging.ERROR
