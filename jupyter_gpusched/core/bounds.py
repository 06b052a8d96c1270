"""What a job may carry: sizes, times and characters, each bounded.

Every string of a job ends up in an exec on a node, in someone's terminal or in every page of
the queue; every time and duration in the scheduler's date arithmetic (deadlines, expected
starts, backfill), where an absurd value (3e11 s, year 9999) overflows. So each has a finite
ceiling here, and a server may set lower ones (:class:`SpecBounds`, from
``GpuSchedPolicy.max_runtime_s`` / ``max_not_before_s``), passed to :mod:`.models`' checks as
the validation context. A spec read back from the store is checked with :data:`STORED`: kept
as it was stored, though bounds may have tightened since.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, StringConstraints, ValidationInfo

from .units import format_duration_s, format_size_bytes

# Limits on what a job may carry. The command and environment end up in an exec on the node,
# where Linux refuses any one string past MAX_ARG_STRLEN (128 KiB with its NUL) and all of
# them past ARG_MAX (2 MiB by default); everything else is stored and listed with the job, so
# a 10 MB label would make every page of the queue 10 MB.
#: Largest argument or environment string ("NAME=value"), in bytes.
MAX_ARG_BYTES = 128 * 1024 - 1
#: Largest command and environment together, in bytes.
MAX_EXEC_BYTES = 1024 * 1024
#: Largest notebook parameters, as JSON.
MAX_PARAMETERS_BYTES = 64 * 1024
#: Longest path (working directory, notebook, staged file).
MAX_PATH = 4096
MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE = 64, 128, 1024
MAX_FILES = 1000

# Times and durations a job may carry: finite ceilings, whatever a server configures.
#: Longest runtime a job may declare, in seconds, whatever the server's configuration: a year.
MAX_RUNTIME_S = 366 * 86400.0
#: Furthest ahead a job's ``not_before`` may lie, in seconds, whatever the configuration.
MAX_NOT_BEFORE_S = 10 * 366 * 86400.0
#: Earliest and latest ``not_before`` a job may carry without a server's ``now`` to judge by.
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(2200, 1, 1, tzinfo=UTC)
#: Validation context for specs read back from the store: kept as stored, even where bounds
#: have tightened since (a job stored under looser ones must still load, show and cancel).
STORED = {"stored": True}

#: Control characters: C0 (but tab, newline and carriage return), DEL and C1. A NUL cannot
#: cross an exec at all; the others are refused where people read the text (names, labels,
#: paths), so nobody's queue view can be rewritten by escape sequences in someone's job.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_OR_BREAK = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class SpecBounds:
    """Bounds a server puts on what a job may ask for, below the hard ceilings above.

    Passed as the validation context ``{"bounds": SpecBounds(...)}`` (:func:`parse_spec`);
    without one, the ceilings hold and ``not_before`` is only checked against fixed dates.
    """

    # Longest declared runtime, seconds (``GpuSchedPolicy.max_runtime_s``).
    max_runtime_s: float = MAX_RUNTIME_S
    # Furthest ahead of ``now`` a start may be asked for, seconds.
    max_not_before_s: float = MAX_NOT_BEFORE_S
    # The server's current time (UTC); None: check ``not_before`` against fixed dates only.
    now: datetime | None = None
    # Where each bound is configured, for the message that names it.
    runtime_source: str = "the longest runtime any job may declare"
    not_before_source: str = "the furthest ahead any job may start"


def stored(info: ValidationInfo) -> bool:
    """Whether this validation reads back what the store kept (see :data:`STORED`)."""
    return bool((info.context or {}).get("stored"))


def bounds_of(info: ValidationInfo) -> SpecBounds | None:
    """The bounds of this validation; None for a spec read back from the store."""
    if stored(info):
        return None
    bounds = (info.context or {}).get("bounds")
    return bounds if isinstance(bounds, SpecBounds) else SpecBounds()


def _no_control(text: str, info: ValidationInfo) -> str:
    """Refuse control characters in text people read (names, labels, paths)."""
    if (bad := _CONTROL_OR_BREAK.search(text)) is not None and not stored(info):
        raise ValueError(f"contains the control character {bad.group()!r}; remove it")
    return text


#: A name, label, model or path: printable text only.
Text = Annotated[str, AfterValidator(_no_control)]
PathText = Annotated[str, StringConstraints(max_length=MAX_PATH), AfterValidator(_no_control)]


def check_runtime(v: float | None, info: ValidationInfo) -> float | None:
    """A declared runtime within the bounds (finite, at most the server's maximum)."""
    if v is None or (bounds := bounds_of(info)) is None:
        return v
    if not math.isfinite(v) or v > bounds.max_runtime_s:
        raise ValueError(
            f"must be at most {bounds.max_runtime_s:.0f} seconds "
            f"({format_duration_s(bounds.max_runtime_s)}, {bounds.runtime_source}), "
            f"not {v!r}"
        )
    return v


def check_not_before(v: datetime | None, info: ValidationInfo) -> datetime | None:
    """A start time, timezone-aware, in UTC, within the bounds (not too far ahead)."""
    if v is None:
        return None
    if v.tzinfo is None:
        raise ValueError("needs a timezone, e.g. 2026-11-23T22:00:00+01:00")
    given = v
    try:
        v = v.astimezone(UTC)
    except OverflowError:  # year 9999 at a negative offset is past what a date holds
        v = _LATEST + timedelta(days=1)
    if (bounds := bounds_of(info)) is None:
        return v
    latest = _LATEST
    if bounds.now is not None:
        latest = min(latest, bounds.now + timedelta(seconds=bounds.max_not_before_s))
    if not _EARLIEST <= v <= latest:
        ahead = format_duration_s(bounds.max_not_before_s)
        raise ValueError(
            f"must lie between {_EARLIEST:%Y-%m-%d} and {latest:%Y-%m-%d %H:%M} UTC "
            f"(at most {ahead} ahead, {bounds.not_before_source}), not {given.isoformat()}"
        )
    return v


def check_strings(strings: Iterable[str], what: str, stored: bool = False) -> None:
    """Refuse any one string the node's exec would refuse (Linux's MAX_ARG_STRLEN, a NUL).

    Control characters other than tab and line breaks are refused too: nothing typed means
    them, and they would rewrite the terminal of whoever lists the job.
    """
    for i, text in enumerate(strings):
        if not stored and (bad := _CONTROL.search(text)) is not None:
            raise ValueError(
                f"{what} {i} contains the control character {bad.group()!r}; "
                "remove it (a NUL cannot be passed to a program at all)"
            )
        size = len(text.encode())
        if size > MAX_ARG_BYTES:
            raise ValueError(
                f"{what} {i} is {format_size_bytes(size)}; at most "
                f"{format_size_bytes(MAX_ARG_BYTES)} each (the node's limit for one string): "
                "pass big data in a file"
            )
