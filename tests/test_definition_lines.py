"""A schedule's next run reads in the schedule's own timezone, the one its label names.

Issue #32: a cron definition's next run showed a UTC time labelled Europe/Berlin
("weekdays at 22:00, next 21:00 (Europe/Berlin; ...)") in a terminal on UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from jupyter_gpusched.cli.formats import format_definition
from jupyter_gpusched.core.api import Definition

NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)  # Monday


def definition(timezone: str) -> Definition:
    return Definition.model_validate(
        {
            "id": 4,
            "user": "alice",
            "schedule": "0 22 * * 1-5",
            "schedule_words": "weekdays at 22:00",
            "timezone": timezone,
            "catch_up": "skip",
            "spec": {"kind": "notebook", "notebook": "train.ipynb", "gpus": 1, "user": "alice"},
            "next_fire_at": "2026-11-23T21:00:00+00:00",  # 22:00 in Berlin
            "created_at": NOW,
            "updated_at": NOW,
        }
    )


def test_a_definitions_next_run_reads_in_its_own_timezone_in_a_utc_terminal() -> None:
    line = format_definition(definition("Europe/Berlin"), now=NOW, tz=UTC)
    assert line == (
        "definition 4 [alice] train.ipynb: weekdays at 22:00, next 22:00 "
        "(Europe/Berlin; cron '0 22 * * 1-5', catch-up skip; 0 runs)"
    )


def test_a_zone_unknown_here_falls_back_to_the_terminals() -> None:
    line = format_definition(definition("Mars/Olympus_Mons"), now=NOW, tz=UTC)
    assert "next 21:00 (Mars/Olympus_Mons;" in line
