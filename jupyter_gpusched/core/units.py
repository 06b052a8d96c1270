"""Durations and sizes as people write them: ``90s``, ``1h30m``, ``16G``, ``512M``.

One place parses and formats both, so what the scheduler prints ("idle leases reclaimed after
30m") is what a user may type back (``--max-runtime 30m``, a policy window's ``"30m"``).
Formatting then parsing gives the same float back, exactly: the parts are whole units plus one
fractional last part, and sizes change unit by powers of two.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|)\s*$", re.IGNORECASE)
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])", re.IGNORECASE)
#: Size units in GB: binary, as GPU memory is counted.
_SIZE_UNITS = {"": 1.0, "k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}
#: Duration units in seconds, largest first.
_DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_size_gb(text: str | float | int) -> float:
    """Read ``16G``, ``16GB``, ``16GiB``, ``512M``, ``1.5T`` or a bare number of GB."""
    if isinstance(text, (int, float)):
        return float(text)
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size; write it like 16G, 512M or 24")
    return float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()[:1]]


def format_size_gb(gb: float) -> str:
    """``16G``, ``1.5T``, ``512M``: the largest unit (K, M, G, T) the size reaches."""
    _check(gb, "size")
    if gb >= 1024:
        return f"{_plain(gb / 1024)}T"
    if gb >= 1 or gb == 0:
        return f"{_plain(gb)}G"
    if gb * 1024 >= 1:
        return f"{_plain(gb * 1024)}M"
    return f"{_plain(gb * 1024**2)}K"


def format_size_bytes(size: float) -> str:
    """``293K``, ``1.05M``, ``96M``: a byte count for a message, to three figures.

    Rounded for reading, unlike :func:`format_size_gb`, whose output parses back exactly.
    """
    _check(size, "size")
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g}{unit}"
    return f"{size:.0f}B"


def parse_duration_s(text: str | float | int) -> float:
    """Read ``90s``, ``15m``, ``2h``, ``1d``, ``1h30m`` (spaces allowed) or a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        return float(stripped)
    parts = _DURATION_RE.findall(stripped)
    if not parts or _DURATION_RE.sub("", stripped).strip():
        raise ValueError(f"{text!r} is not a duration; write it like 90s, 15m, 2h or 1h30m")
    mult = dict(_DURATION_UNITS)
    return sum(float(v) * mult[u.lower()] for v, u in parts)


def format_duration_s(seconds: float, *, parts: int | None = None) -> str:
    """``1h30m``, ``2d4h``, ``1.5s``, ``0s``: days, hours, minutes, seconds, zeros left out.

    ``parts`` keeps only that many leading parts (``parts=1``: ``3h`` for 3h25m), for columns
    where the order of magnitude is enough; the result then reads back as less than given.
    """
    _check(seconds, "duration")
    whole = math.floor(seconds)
    rest = whole
    out: list[str] = []
    for unit, size in _DURATION_UNITS[:-1]:
        count, rest = divmod(rest, size)
        if count:
            out.append(f"{count}{unit}")
    # the fraction rides on the seconds; whole + fraction is exact below 2**52 s
    last = seconds - (whole - rest)
    if last:
        out.append(f"{_plain(last)}s")
    return "".join(out[:parts]) or "0s"


def _plain(value: float) -> str:
    """The shortest decimal that reads back as ``value``, never in exponent form."""
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text[:-2] if text.endswith(".0") else text


def _check(value: float, what: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a {what} must be a finite number >= 0, got {value!r}")
