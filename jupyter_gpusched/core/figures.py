"""How every client writes a figure: one formatter per figure, shared by widget, CLI and magic.

The lab panel mirrors these in ``labextension/src/format.ts``; both are checked against the
same table of figures (``labextension/test/figures.json``), so "0.5 GPU", "16G", "2nd in
line" or "in 12m (14:05)" read the same wherever a user looks. Durations and sizes come from
:mod:`.units`. Pure: ``now`` and the timezone are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, tzinfo
from typing import Any

from .units import format_duration_s, format_size_gb

#: An expected start this close counts as "any moment".
SOON_S = 60.0
#: English names, whatever the locale: every client writes the same words.
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def gpus_label(gpus: int, gpu_share: float | None = None, gpu_mem_gb: float | None = None) -> str:
    """``1 GPU``, ``2 GPUs``, ``0.5 GPU`` (a share of one), ``2 GPUs × 16G`` (memory of each)."""
    if gpus == 0:
        return "no GPU"
    if gpu_share is not None and gpu_share < 1:
        each = f"{gpu_share:g} GPU"
        return each if gpus == 1 else f"{gpus} × {each}"
    text = f"{gpus} GPU{'' if gpus == 1 else 's'}"
    if gpu_mem_gb:
        text += f" × {format_size_gb(gpu_mem_gb)}"
    return text


def percent(share: float) -> str:
    """A share 0-1 as a whole percentage: ``59%`` (halves round up, as in JavaScript)."""
    return f"{math.floor(share * 100 + 0.5):d}%"


def gpu_count(gpus: float) -> str:
    """A GPU count that may be fractional: ``3 GPUs``, ``1 GPU``, ``1.5 GPUs``."""
    value = math.floor(gpus * 100 + 0.5) / 100
    return f"{value:g} GPU{'' if value == 1 else 's'}"


def position_label(position: int) -> str:
    """A queue position that cannot be mistaken for a job id: ``1st in line``."""
    if 10 <= position % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
    return f"{position}{suffix} in line"


def clock_label(at: datetime, now: datetime, tz: tzinfo) -> str:
    """Local ``14:05`` today, ``Tue 14:05`` within a week either side, else ``Dec 1 14:05``."""
    local, today = at.astimezone(tz), now.astimezone(tz)
    hm = f"{local.hour:02d}:{local.minute:02d}"
    if local.date() == today.date():
        return hm
    if abs((local.date() - today.date()).days) < 7:
        return f"{_DAYS[local.weekday()]} {hm}"
    return f"{_MONTHS[local.month - 1]} {local.day} {hm}"


def eta_label(at: datetime | None, now: datetime, tz: tzinfo) -> str:
    """When an expected start is, for people: ``in 12m (14:05)``, ``any moment``, ``unknown``."""
    if at is None:
        return "unknown"
    wait_s = (at - now).total_seconds()
    if wait_s <= SOON_S:
        return "any moment"
    minutes = int(wait_s // 60) * 60  # to the minute: "in 1h5m", not "in 1h5m17s"
    return f"in {format_duration_s(minutes, parts=2)} ({clock_label(at, now, tz)})"


def start_label(
    estimate: Mapping[str, Any] | None, fallback: datetime | None, now: datetime, tz: tzinfo
) -> str:
    """An expected start and how firm it is (the API's ``estimate``; else ``fallback``).

    ``in 40m (09:40) at the latest`` (declared limits), ``in about 15m (09:15; 09:05-09:15 by
    past runtimes)``, ``in 3h59m (12:59) by a guess``, ``any moment``, ``unknown``.
    """
    if not estimate:
        return eta_label(fallback, now, tz)
    at, basis = _when(estimate.get("at")), estimate.get("basis")
    if at is None or basis == "unknown":
        return "unknown"
    eta = eta_label(at, now, tz)
    if basis not in ("limits", "history", "guess") or eta == "any moment":
        return eta
    if basis == "limits":
        return f"{eta} at the latest"
    if basis == "guess":
        return f"{eta} by a guess"
    lo, hi = _when(estimate.get("earliest")), _when(estimate.get("latest"))
    span = clock_label(lo, now, tz) if lo is not None else ""
    span += f"–{clock_label(hi, now, tz)}" if hi is not None else " or later"
    return f"in about {eta.removeprefix('in ').removesuffix(')')}; {span} by past runtimes)"


def start_nudge(estimate: Mapping[str, Any] | None) -> str:
    """The note where a guess or nothing decides the start (what to do about it), else ``""``."""
    if not estimate or estimate.get("basis") not in ("guess", "unknown"):
        return ""
    return str(estimate.get("note") or "")


def _when(value: datetime | str | None) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def runtime_label(seconds: float) -> str:
    """A runtime to the second below an hour, to the minute above: ``12m3s``, ``3h5m``."""
    whole = int(max(0.0, seconds))
    if whole >= 3600:
        whole = whole // 60 * 60
    return format_duration_s(whole, parts=2)


def memory_label(used_gb: float, total_gb: float) -> str:
    """``12G / 80G``: memory used of a GPU's total, to a tenth of a GB."""
    return f"{format_size_gb(_tenth(used_gb))} / {format_size_gb(_tenth(total_gb))}"


def fragmentation_text(metrics: Mapping[str, Any]) -> str:
    """The figures in words: what fits now, what is stranded, and what is good.

    ``metrics`` is ``GET cluster``'s ``metrics`` (a dict).
    """
    largest = int(metrics.get("largest_placeable_gpus") or 0)
    node = metrics.get("largest_placeable_node")
    fits = f"largest job that fits now: {gpu_count(largest)}"
    if largest and node:
        fits += f" (on {node})"
    stranded = float(metrics.get("gpus_stranded") or 0.0)
    parts = [fits, f"{gpu_count(stranded)} stranded in partly used GPUs"]
    frag = metrics.get("frag_ratio")
    if isinstance(frag, (int, float)):
        parts.append(
            f"{percent(frag)} of the free capacity fits no usual job size (lower is better)"
        )
    return "; ".join(parts)


def window_line(window: Mapping[str, Any], now: datetime, tz: tzinfo) -> str:
    """``day window until 20:00, then night``: the window in force and what follows."""
    line = f"{window.get('name')} window"
    until = window.get("until")
    if until:
        at = datetime.fromisoformat(until) if isinstance(until, str) else until
        line += f" until {clock_label(at, now, tz)}"
        if window.get("next_window"):
            line += f", then {window['next_window']}"
    return line


def schedule_line(words: str, next_at: datetime | None, now: datetime, tz: tzinfo) -> str:
    """``weekdays at 22:00, next Tue 22:00``: a recurring job's schedule and its next run."""
    if next_at is None:
        return f"{words}, no next run"
    return f"{words}, next {clock_label(next_at, now, tz)}"


def _tenth(value: float) -> float:
    return math.floor(value * 10 + 0.5) / 10
