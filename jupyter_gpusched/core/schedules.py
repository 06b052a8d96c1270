"""Cron schedules in words: ``0 22 * * 1-5`` reads "weekdays at 22:00".

Pure string work (no croniter): the common shapes people write get words; anything else is
shown as the expression itself, so nothing is ever described wrongly.
"""

from __future__ import annotations

import re

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_NAMES = {name[:3].lower(): i for i, name in enumerate(_DAYS)}
_MONTH_NAMES = {m.lower(): i + 1 for i, m in enumerate(_MONTHS)}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NUM = re.compile(r"\d+")


def cron_words(expr: str) -> str:
    """The schedule in words ("weekdays at 22:00"), else ``cron '<expr>'``."""
    text = " ".join(expr.split())
    fields = _MACROS.get(text.lower(), text).split()
    if len(fields) != 5:
        return f"cron '{text}'"
    try:
        return _words(*fields)
    except ValueError:
        return f"cron '{text}'"


def _words(minute: str, hour: str, dom: str, month: str, dow: str) -> str:
    when = _time_words(minute, hour)
    days = _day_words(dom, dow)
    months = _month_words(month)
    out = f"{days} {when}" if when.startswith("at ") else f"{when}, {days}"
    if days == "every day" and not when.startswith("at "):
        out = when
    return f"{out}{months}"


def _time_words(minute: str, hour: str) -> str:
    if minute == "*" and hour == "*":
        return "every minute"
    step = re.fullmatch(r"\*/(\d+)", minute)
    if step and hour == "*":
        return f"every {int(step.group(1))} minutes"
    if _NUM.fullmatch(minute):
        m = int(minute)
        if not 0 <= m <= 59:
            raise ValueError(minute)
        if hour == "*":
            return f"every hour at :{m:02d}"
        hstep = re.fullmatch(r"\*/(\d+)", hour)
        if hstep:
            return f"every {int(hstep.group(1))} hours at :{m:02d}"
        hours = _list(hour, 0, 23)
        if len(hours) > 3 and hours == list(range(hours[0], hours[-1] + 1)):
            return f"every hour from {hours[0]:02d}:{m:02d} to {hours[-1]:02d}:{m:02d}"
        return "at " + _and([f"{h:02d}:{m:02d}" for h in hours])
    raise ValueError(minute)


def _day_words(dom: str, dow: str) -> str:
    if dom == "*" and dow in ("*", "?"):
        return "every day"
    if dom == "*":
        days = sorted({d % 7 for d in _list(dow, 0, 7, _NAMES)})
        if days == [1, 2, 3, 4, 5]:
            return "weekdays"
        if days == [0, 6]:
            return "weekends"
        if len(days) > 2 and days == list(range(days[0], days[-1] + 1)):
            return f"{_DAYS[days[0]]} to {_DAYS[days[-1]]}"
        return _and([f"{_DAYS[d]}s" for d in days])
    if dow in ("*", "?"):
        return "on day " + _and([str(d) for d in _list(dom, 1, 31)]) + " of the month"
    raise ValueError(dom)


def _month_words(month: str) -> str:
    if month == "*":
        return ""
    return " in " + _and([_MONTHS[m - 1] for m in _list(month, 1, 12, _MONTH_NAMES)])


def _list(field: str, lo: int, hi: int, names: dict[str, int] | None = None) -> list[int]:
    """``1,3-5`` as [1, 3, 4, 5]; names (``mon``, ``jan``) where given; ValueError otherwise."""
    out: list[int] = []
    for part in field.split(","):
        bounds = [_value(x, names) for x in part.split("-")]
        if len(bounds) == 1:
            bounds *= 2
        if len(bounds) != 2 or not lo <= bounds[0] <= bounds[1] <= hi:
            raise ValueError(field)
        out += range(bounds[0], bounds[1] + 1)
    return out


def _value(text: str, names: dict[str, int] | None) -> int:
    if _NUM.fullmatch(text):
        return int(text)
    if names and text.lower()[:3] in names:
        return names[text.lower()[:3]]
    raise ValueError(text)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
