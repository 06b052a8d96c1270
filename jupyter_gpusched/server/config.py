"""Traitlets configuration of the time-of-day policy: Jupyter config in, ``PolicyConfig`` out.

Set in ``jupyter_server_config.py``, e.g.::

    c.GpuSchedPolicy.timezone = "Europe/Berlin"
    c.GpuSchedPolicy.windows = [
        {"name": "day", "days": "Mon-Fri", "start": "08:00", "end": "20:00",
         "interactive_reserved_share": 0.25, "interactive_max_share": 0.75,
         "batch_max_runtime_s": "4h", "lease_idle_timeout_s": "30m", "preempt_batch": True},
        {"name": "night", "interactive_max_share": 0.5, "lease_idle_timeout_s": "2h"},
    ]
    c.GpuSchedPolicy.quotas = {"alice": {"gpus_at_once": 4, "gpu_hours_per_day": 48}}
    c.GpuSchedPolicy.limits = {"queued_jobs": 2000, "upload_bytes": "4G"}
    c.GpuSchedPolicy.group_limits = {"nlp": {"running_jobs": 1000}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import time
from typing import Any
from zoneinfo import ZoneInfo

from traitlets import Dict, Enum, Float, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from jupyter_gpusched.core.bounds import MAX_NOT_BEFORE_S, MAX_RUNTIME_S
from jupyter_gpusched.core.limits import (
    LIMIT_KEYS,
    NO_LIMITS,
    SERVICE_LIMITS,
    LimitPolicy,
    Overrides,
    limits_text,
    with_overrides,
)
from jupyter_gpusched.core.units import parse_duration_s, parse_size_gb
from jupyter_gpusched.core.windows import (
    ALL_DAYS,
    DAY_NAMES,
    DEFAULT_WINDOWS,
    PolicyConfig,
    Quota,
    Window,
    rule_values,
)

_WINDOW_KEYS = {
    "name", "days", "start", "end", "interactive_reserved_share", "interactive_max_share",
    "batch_max_runtime_s", "lease_idle_timeout_s", "preempt_batch", "migrate_batch",
    "interactive_first",
}  # fmt: skip
_QUOTA_KEYS = {"gpus_at_once", "gpu_hours_per_day"}
_LIMITS_HELP = (
    "Keys: queued_jobs (jobs queued at once; a bulk submit counts each job), running_jobs "
    "(jobs starting or running at once; more wait in the queue), array_size (jobs in one bulk "
    "submit), leases (%%gpu and GPU-kernel leases queued or running at once), streams (event "
    "websockets and log follows open at once), upload_bytes (bytes of uploaded files and "
    "stored notebooks held for jobs not yet ended; a number of bytes or '2G'), submits_per_s "
    "(requests that create jobs, notebooks or definitions, per second) and submit_burst (how "
    "many such requests at once before the rate holds them; default: one second's worth). "
    "A missing key leaves the value below; None means unlimited."
)


class GpuSchedPolicy(Configurable):
    """Time-of-day windows, per-user quotas and fair share of the GPU queue."""

    timezone = Unicode(
        "UTC",
        help="IANA timezone the windows' days and times and the per-day quotas are written in, "
        "e.g. 'Europe/Berlin'.",
    ).tag(config=True)

    windows = List(
        Dict(),
        help="Time-of-day windows in priority order (the first listed wins where they overlap). "
        "Keys: name; days ('Mon-Fri', ['Sat','Sun'], all when absent); start and end (local "
        "'HH:MM'; end <= start wraps past midnight; absent = all day); "
        "interactive_reserved_share (0-1 of GPUs batch may not take); interactive_max_share "
        "(0-1 of GPUs leases may hold); batch_max_runtime_s (seconds or '4h'; batch jobs started "
        "in the window are stopped after it); lease_idle_timeout_s (seconds or '30m'); "
        "preempt_batch (bool: batch may be stopped and requeued for waiting leases); "
        "migrate_batch (bool: batch may be moved to other nodes to open one for a bigger "
        "batch job); interactive_first (bool). A window with no days, start and end "
        "holds whenever no other does. Times are local wall-clock times: on DST change days "
        "a boundary at a skipped time (e.g. 02:30 in spring) falls at the jump, one at a "
        "repeated time at its first occurrence. "
        "Default: 'day' Mon-Fri 08:00-20:00, 'night' otherwise.",
    ).tag(config=True)

    quotas = Dict(
        help="Per-user quotas: {user: {'gpus_at_once': GPUs, 'gpu_hours_per_day': GPU-hours}}; "
        "a missing key means unlimited.",
    ).tag(config=True)

    default_quota = Dict(
        help="Quota of users not in 'quotas', same keys; empty = unlimited.",
    ).tag(config=True)

    limit_defaults = Enum(
        ["auto", "on", "off"],
        default_value="auto",
        help="Everyone's limits before GpuSchedPolicy.limits: 'on' the lab-wide service's "
        f"defaults ({limits_text(SERVICE_LIMITS)}), 'off' none, 'auto' (the default) 'on' in "
        "the lab-wide service (jupyter gpusched service) and 'off' in a personal server, "
        "where nobody else is there to protect.",
    ).tag(config=True)

    limits = Dict(
        help="Everyone's per-user limits, over the defaults that limit_defaults gives, e.g. "
        "{'queued_jobs': 2000, 'upload_bytes': '4G', 'streams': None}. Over a limit a request "
        "is refused with 429 and Retry-After (array_size: 422), naming the limit and the "
        "user's count; over running_jobs a job waits. " + _LIMITS_HELP,
    ).tag(config=True)

    group_limits = Dict(
        help="Limits by group: {group: {key: value}}, over everyone's. Where a user's groups "
        "set a key differently, the most generous wins (None, unlimited, above all). Groups "
        "are JupyterHub's (its user model) and those user_groups lists.",
    ).tag(config=True)

    admin_limits = Dict(
        help="Limits of the queue's admins, over everyone's and their groups': {key: value}.",
    ).tag(config=True)

    user_limits = Dict(
        help="A user's own limits, over everything else: {user: {key: value}}.",
    ).tag(config=True)

    user_groups = Dict(
        help="Groups of users for group_limits, besides those JupyterHub says: "
        "{user: [group, ...]} (without a Hub the only source of groups).",
    ).tag(config=True)

    fairshare_half_life_s = Float(
        7 * 86400.0,
        help="Fair-share half-life in seconds: past GPU usage counts half as much after this "
        "long when ordering the queue.",
    ).tag(config=True)

    default_runtime_s = Float(
        4 * 3600.0,
        help="Runtime in seconds assumed for a batch job that declares none and whose owner "
        "has no history (used to plan backfill).",
    ).tag(config=True)

    max_runtime_s = Float(
        PolicyConfig.max_runtime_s,
        help="Longest runtime, in seconds, a job may declare (max_runtime_s): longer ones are "
        f"refused at submit with 422. At most {MAX_RUNTIME_S:.0f} (a year).",
    ).tag(config=True)

    max_not_before_s = Float(
        PolicyConfig.max_not_before_s,
        help="How far ahead, in seconds, a job may ask to start (not_before, 'submit-notebook "
        f"--at'): later ones are refused at submit with 422. At most {MAX_NOT_BEFORE_S:.0f} "
        "(ten years).",
    ).tag(config=True)

    runtime_percentile = Float(
        90.0,
        help="Percentile (0-100) of a user's past runtimes used as the runtime estimate of "
        "their undeclared batch jobs.",
    ).tag(config=True)

    @default("windows")
    def _default_windows(self) -> list[dict[str, Any]]:
        return [window_to_dict(w) for w in DEFAULT_WINDOWS]

    @validate("timezone")
    def _check_timezone(self, proposal: Any) -> str:
        value = proposal["value"]
        try:
            ZoneInfo(value)
        except (KeyError, ValueError):
            raise TraitError(
                f"GpuSchedPolicy.timezone {value!r} is not a known IANA timezone; "
                "use a name like 'Europe/Berlin' or 'UTC'"
            ) from None
        return str(value)

    @validate("windows")
    def _check_windows(self, proposal: Any) -> list[dict[str, Any]]:
        value = proposal["value"]
        if not value:
            raise TraitError("GpuSchedPolicy.windows [] is empty; give at least one window")
        names = []
        for item in value:
            try:
                names.append(window_from_dict(item).name)
            except ValueError as exc:
                raise TraitError(f"GpuSchedPolicy.windows: {exc}") from None
        if len(set(names)) != len(names):
            raise TraitError(f"GpuSchedPolicy.windows: names must be unique, got {names!r}")
        return list(value)

    @validate("default_quota", "limits", "admin_limits")
    def _check_one(self, proposal: Any) -> dict[str, Any]:
        name = proposal["trait"].name
        parse = quota_from_dict if name == "default_quota" else limits_from_dict
        _parsed(f"GpuSchedPolicy.{name}", proposal["value"], parse)
        return dict(proposal["value"])

    @validate("quotas", "group_limits", "user_limits")
    def _check_each(self, proposal: Any) -> dict[str, Any]:
        name = proposal["trait"].name
        parse = quota_from_dict if name == "quotas" else limits_from_dict
        for key, value in proposal["value"].items():
            _parsed(f"GpuSchedPolicy.{name}[{key!r}]", value, parse)
        return dict(proposal["value"])

    @validate("user_groups")
    def _check_user_groups(self, proposal: Any) -> dict[str, Any]:
        for user, groups in proposal["value"].items():
            if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
                raise TraitError(
                    f"GpuSchedPolicy.user_groups[{user!r}] {groups!r} must be a list of group "
                    "names, e.g. ['nlp']"
                )
        return dict(proposal["value"])

    @validate("fairshare_half_life_s", "default_runtime_s")
    def _check_positive(self, proposal: Any) -> float:
        value = proposal["value"]
        if not value > 0:
            name = proposal["trait"].name
            raise TraitError(f"GpuSchedPolicy.{name} {value!r} must be > 0 seconds")
        return float(value)

    @validate("max_runtime_s", "max_not_before_s")
    def _check_bound(self, proposal: Any) -> float:
        value, name = proposal["value"], proposal["trait"].name
        ceiling = MAX_RUNTIME_S if name == "max_runtime_s" else MAX_NOT_BEFORE_S
        if not 0 < value <= ceiling:
            raise TraitError(
                f"GpuSchedPolicy.{name} {value!r} must be more than 0 and at most {ceiling:.0f} "
                "seconds"
            )
        return float(value)

    @validate("runtime_percentile")
    def _check_percentile(self, proposal: Any) -> float:
        value = proposal["value"]
        if not 0 <= value <= 100:
            raise TraitError(f"GpuSchedPolicy.runtime_percentile {value!r} must be 0-100")
        return float(value)

    def to_policy_config(self, *, service: bool = False) -> PolicyConfig:
        """The pure policy's view of this configuration.

        ``service``: for the lab-wide service, where ``limit_defaults = 'auto'`` means 'on'.
        """
        return PolicyConfig(
            timezone=self.timezone,
            windows=tuple(window_from_dict(w) for w in self.windows),
            quotas={user: quota_from_dict(q) for user, q in self.quotas.items()},
            default_quota=quota_from_dict(self.default_quota),
            fairshare_half_life_s=self.fairshare_half_life_s,
            default_runtime_s=self.default_runtime_s,
            runtime_percentile=self.runtime_percentile,
            max_runtime_s=self.max_runtime_s,
            max_not_before_s=self.max_not_before_s,
            limits=self.limit_policy(service=service),
        )

    def limit_policy(self, *, service: bool = False) -> LimitPolicy:
        """The per-user limits (see :mod:`jupyter_gpusched.core.limits`)."""
        on = self.limit_defaults == "on" or (self.limit_defaults == "auto" and service)
        return LimitPolicy(
            everyone=with_overrides(SERVICE_LIMITS if on else NO_LIMITS, limits_from_dict(
                self.limits
            )),
            groups={g: limits_from_dict(v) for g, v in self.group_limits.items()},
            users={u: limits_from_dict(v) for u, v in self.user_limits.items()},
            admins=limits_from_dict(self.admin_limits),
            user_groups={u: frozenset(g) for u, g in self.user_groups.items()},
        )  # fmt: skip


def _parsed(where: str, value: Any, parse: Callable[[Any], Any]) -> None:
    """``parse(value)``, its ValueError a TraitError saying ``where`` the bad value is."""
    try:
        parse(value)
    except ValueError as exc:
        raise TraitError(f"{where}: {exc}") from None


def parse_days(value: object) -> frozenset[int]:
    """Read ``"Mon-Fri"``, ``"Sat,Sun"``, ``["Mon", "Wed"]`` or ``[0, 2]`` into weekday numbers."""
    if value is None or value == "" or value == "*":
        return ALL_DAYS
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set, frozenset)) or not items:
        raise ValueError(f"days {value!r} must be like 'Mon-Fri' or ['Sat', 'Sun']")
    out: set[int] = set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 6:
            out.add(item)
            continue
        lo, _, hi = str(item).strip().partition("-")
        try:
            a = _day_index(lo)
            b = _day_index(hi) if hi else a
        except ValueError:
            raise ValueError(f"days {value!r}: {item!r} is not a weekday like 'Mon'") from None
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


def _day_index(text: str) -> int:
    key = text.strip()[:3].title()
    if len(text.strip()) < 3 or key not in DAY_NAMES:
        raise ValueError(text)
    return DAY_NAMES.index(key)


def _parse_time(key: str, value: object) -> time:
    if isinstance(value, time):
        return value
    text = str(value).strip()
    if text == "24:00":
        return time(0, 0)
    try:
        hh, mm = text.split(":")
        return time(int(hh), int(mm))
    except ValueError:
        raise ValueError(f"{key} {value!r} must be a local time like '08:00'") from None


def _parse_seconds(key: str, value: object, *, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        seconds = parse_duration_s(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{key} {value!r} must be seconds or a duration like '4h'") from None
    if not seconds > 0:
        raise ValueError(f"{key} {value!r} must be positive")
    return seconds


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} {value!r} must be a number")
    return float(value)


def window_from_dict(data: Mapping[str, Any]) -> Window:
    """Build a :class:`Window` from a config dict; ValueError messages quote the bad value."""
    if not isinstance(data, Mapping):
        raise ValueError(f"window {data!r} must be a dict with at least a 'name'")
    unknown = sorted(set(data) - _WINDOW_KEYS)
    if unknown:
        raise ValueError(f"unknown window key {unknown[0]!r}; known keys: {sorted(_WINDOW_KEYS)}")
    if not data.get("name"):
        raise ValueError(f"window {dict(data)!r} needs a 'name'")
    kwargs: dict[str, Any] = {"name": str(data["name"]), "days": parse_days(data.get("days"))}
    for key in ("start", "end"):
        if key in data:
            kwargs[key] = _parse_time(key, data[key])
    for key in ("interactive_reserved_share", "interactive_max_share"):
        if key in data:
            kwargs[key] = _number(key, data[key])
    for key in ("batch_max_runtime_s", "lease_idle_timeout_s"):
        if key in data:
            kwargs[key] = _parse_seconds(key, data[key])
    for key in ("preempt_batch", "migrate_batch", "interactive_first"):
        if key in data:
            if not isinstance(data[key], bool):
                raise ValueError(f"{key} {data[key]!r} must be true or false")
            kwargs[key] = data[key]
    try:
        return Window(**kwargs)
    except ValueError as exc:
        raise ValueError(f"window {kwargs['name']!r}: {exc}") from None


def window_to_dict(w: Window) -> dict[str, Any]:
    """The config dict that :func:`window_from_dict` reads back into ``w``."""
    out: dict[str, Any] = {"name": w.name}
    if w.days != ALL_DAYS:
        out["days"] = [DAY_NAMES[d] for d in sorted(w.days)]
    if w.start != w.end or w.days != ALL_DAYS:
        out["start"], out["end"] = f"{w.start:%H:%M}", f"{w.end:%H:%M}"
    return {**out, **rule_values(w)}


def quota_from_dict(data: Mapping[str, Any]) -> Quota:
    """Build a :class:`Quota`; ValueError messages quote the bad value."""
    if not isinstance(data, Mapping):
        raise ValueError(f"quota {data!r} must be a dict like {{'gpus_at_once': 4}}")
    unknown = sorted(set(data) - _QUOTA_KEYS)
    if unknown:
        raise ValueError(f"unknown quota key {unknown[0]!r}; known keys: {sorted(_QUOTA_KEYS)}")
    values: dict[str, float | None] = {}
    for key in sorted(_QUOTA_KEYS):
        value = data.get(key)
        if value is not None:
            value = _number(key, value)
            if value < 0:
                raise ValueError(f"{key} {data[key]!r} must be >= 0")
        values[key] = value
    return Quota(**values)


_COUNT_KEYS = frozenset(LIMIT_KEYS) - {"upload_bytes", "submits_per_s"}


def limits_from_dict(data: Mapping[str, Any]) -> Overrides:
    """Read a limits dict (``GpuSchedPolicy.limits``): each key's value checked, sizes read.

    ValueError messages quote the bad value.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"limits {data!r} must be a dict like {{'queued_jobs': 1000}}")
    unknown = sorted(set(data) - set(LIMIT_KEYS))
    if unknown:
        raise ValueError(f"unknown limit {unknown[0]!r}; known limits: {list(LIMIT_KEYS)}")
    out: dict[str, float | int | None] = {}
    for key, value in data.items():
        if value is None:
            out[key] = None
        elif key == "upload_bytes":
            out[key] = _size_bytes(value)
        elif key == "submits_per_s":
            rate = _number(key, value)
            if rate < 0:
                raise ValueError(f"{key} {value!r} must be >= 0 (None: unlimited)")
            out[key] = rate
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} {value!r} must be a whole number >= 0 (None: unlimited)")
        else:
            out[key] = value
    return out


def _size_bytes(value: object) -> int:
    """Bytes from ``2147483648``, ``'2G'``, ``'512M'`` (binary units, as sizes here are)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text) if text.isdigit() else round(parse_size_gb(text) * (1 << 30))
        except ValueError:
            pass
    raise ValueError(f"upload_bytes {value!r} must be bytes or a size like '2G' or '512M'")
