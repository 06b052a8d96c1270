"""Per-user and per-group limits: how much of a shared queue one user may hold at once.

The lab-wide service's answer to "nobody can hurt anybody else" (Slurm's association limits
MaxSubmitJobs, MaxJobs, MaxArraySize; Kubernetes' ResourceQuota). Pure: plain data in, plain
data out; nothing here counts, reads a clock or a file. The server counts and asks
(:mod:`jupyter_gpusched.server.userlimits`), the scheduler's admission weighs ``running_jobs``
(:func:`jupyter_gpusched.core.policy.admit`).

Which value holds for a user, key by key (a level that does not set a key leaves the one
below; ``None`` sets "unlimited")::

    GpuSchedPolicy.user_limits[user]      the user's own
    GpuSchedPolicy.admin_limits           the queue's admins
    GpuSchedPolicy.group_limits[group]    the user's groups; where several set a key, the most
                                          generous wins (None, unlimited, most of all)
    GpuSchedPolicy.limits                 everyone's, over the mode's defaults
                                          (SERVICE_LIMITS in the lab-wide service, none in a
                                          personal server)

A user's groups: those the identity says (JupyterHub's user model) and those
``GpuSchedPolicy.user_groups`` lists for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .units import format_size_bytes

#: The limits, in the order they are shown.
LIMIT_KEYS: tuple[str, ...] = (
    "queued_jobs",
    "running_jobs",
    "array_size",
    "leases",
    "streams",
    "upload_bytes",
    "submits_per_s",
    "submit_burst",
)
#: What one setting may give: a value per key, None for unlimited (absent: not set there).
Overrides = Mapping[str, float | int | None]
#: Seconds a refused caller is told to wait (``Retry-After``) before trying again, by limit;
#: a rate's wait is worked out from its bucket.
RETRY_AFTER_S: Mapping[str, float] = {
    "queued_jobs": 30.0,
    "leases": 30.0,
    "streams": 10.0,
    "upload_bytes": 60.0,
}


@dataclass(frozen=True)
class Limits:
    """One user's limits; None = unlimited."""

    # Jobs queued at once (a bulk submit counts each of its jobs).
    queued_jobs: int | None = None
    # Jobs starting or running at once; more wait in the queue (Slurm's MaxJobs).
    running_jobs: int | None = None
    # Jobs in one bulk submit (an array's N, or a list's length).
    array_size: int | None = None
    # Leases (%%gpu kernels, GPU kernels) queued, starting or running at once.
    leases: int | None = None
    # Event websockets and log follows open at once.
    streams: int | None = None
    # Bytes of uploaded files and stored notebooks held at once (of jobs not yet ended).
    upload_bytes: int | None = None
    # Creating requests (POST jobs, notebooks, definitions) per second, sustained.
    submits_per_s: float | None = None
    # Creating requests allowed at once before the rate holds them (the bucket's size);
    # None: one second's worth of ``submits_per_s`` (at least 1).
    submit_burst: int | None = None

    def __post_init__(self) -> None:
        for key in LIMIT_KEYS:
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} {value!r} must be a number >= 0, or None (unlimited)")

    @property
    def off(self) -> bool:
        """True when nothing is limited."""
        return all(getattr(self, key) is None for key in LIMIT_KEYS)

    def burst(self) -> float:
        """The rate bucket's size: ``submit_burst``, else a second's worth (at least 1)."""
        if self.submit_burst is not None:
            return float(self.submit_burst)
        return max(1.0, float(self.submits_per_s or 0.0))


#: The lab-wide service's defaults (``GpuSchedPolicy.limit_defaults``): generous for people,
#: tight for a runaway script. A personal server has none.
SERVICE_LIMITS = Limits(
    queued_jobs=10_000,
    running_jobs=500,
    array_size=10_000,
    leases=4,
    streams=16,
    upload_bytes=2 << 30,
    submits_per_s=20.0,
    submit_burst=100,
)
NO_LIMITS = Limits()


def with_overrides(base: Limits, overrides: Overrides) -> Limits:
    """``base`` with the keys ``overrides`` sets."""
    return replace(base, **{k: v for k, v in overrides.items() if k in LIMIT_KEYS})


@dataclass(frozen=True)
class UserLimits:
    """The limits that hold for one user, and which setting gave each."""

    # Whose.
    user: str
    # The values.
    limits: Limits
    # Limit key -> the setting that gave it, e.g. "GpuSchedPolicy.group_limits['nlp']".
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The user's groups that some setting names (the others change nothing).
    groups: tuple[str, ...] = ()

    def named(self, key: str) -> str:
        """The setting and key to name in a refusal: ``GpuSchedPolicy.limits queued_jobs``."""
        return f"{self.sources.get(key, EVERYONE)} {key}"


EVERYONE = "GpuSchedPolicy.limits"
ADMINS = "GpuSchedPolicy.admin_limits"


@dataclass(frozen=True)
class LimitPolicy:
    """Every limit setting (see the module docstring for the precedence)."""

    # Everyone's limits (the mode's defaults with GpuSchedPolicy.limits over them).
    everyone: Limits = NO_LIMITS
    # Group name -> the keys that group sets.
    groups: Mapping[str, Overrides] = field(default_factory=dict, hash=False)
    # User name -> the keys set for that user alone.
    users: Mapping[str, Overrides] = field(default_factory=dict, hash=False)
    # The keys set for the queue's admins.
    admins: Overrides = field(default_factory=dict, hash=False)
    # User name -> groups they are in besides those their identity says.
    user_groups: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)

    @property
    def off(self) -> bool:
        """True when no setting limits anyone: nothing needs counting."""
        return self.everyone.off and not any(
            v is not None for o in (*self.groups.values(), *self.users.values(), self.admins)
            for v in o.values()
        )  # fmt: skip

    def groups_of(self, user: str, said: Iterable[str] = ()) -> list[str]:
        """``user``'s groups: those their identity says and those configured for them."""
        return sorted({*said, *self.user_groups.get(user, ())})

    def for_user(self, user: str, groups: Iterable[str] = (), admin: bool = False) -> UserLimits:
        """The limits that hold for ``user`` (in ``groups``, an admin or not)."""
        if self.off:
            return UserLimits(user, NO_LIMITS)
        values = {k: getattr(self.everyone, k) for k in LIMIT_KEYS}
        sources = dict.fromkeys(LIMIT_KEYS, EVERYONE)
        member = [g for g in self.groups_of(user, groups) if g in self.groups]
        for key in LIMIT_KEYS:
            given = [(g, self.groups[g][key]) for g in member if key in self.groups[g]]
            if given:
                # the most generous: unlimited above any number, then the largest
                group, value = max(given, key=lambda gv: (gv[1] is None, gv[1] or 0))
                values[key], sources[key] = value, f"GpuSchedPolicy.group_limits[{group!r}]"
        layers = [(self.admins, ADMINS)] if admin else []
        if user in self.users:
            layers.append((self.users[user], f"GpuSchedPolicy.user_limits[{user!r}]"))
        for overrides, source in layers:
            for key, value in overrides.items():
                values[key], sources[key] = value, source
        return UserLimits(user, Limits(**values), sources, tuple(member))


# --------------------------------------------------------------------------------------------
# The submission rate: a token bucket per user


@dataclass(frozen=True)
class Bucket:
    """A user's submission tokens at an instant."""

    # Tokens left (a request takes one).
    tokens: float
    # When they were counted (monotonic seconds).
    at: float


def take_token(bucket: Bucket | None, limits: Limits, now: float) -> tuple[Bucket | None, float]:
    """Take one request's token: the bucket after, and 0.0 or the seconds until one is there.

    The bucket refills at ``submits_per_s`` up to :meth:`Limits.burst`; a new one is full.
    """
    rate = limits.submits_per_s
    if rate is None:
        return None, 0.0
    size = limits.burst()
    tokens = size if bucket is None else min(size, bucket.tokens + (now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), 0.0
    wait_s = (1.0 - tokens) / rate if rate > 0 else math.inf
    return Bucket(tokens, now), wait_s


# --------------------------------------------------------------------------------------------
# What a refusal says


def _n(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _count(value: float, one: str, many: str) -> str:
    """``1 lease``, ``2 leases``: a count and its noun."""
    return f"{_n(value)} {one if value == 1 else many}"


def refusal(mine: UserLimits, key: str, have: float, asking: float = 0) -> str:
    """Why a request is over ``key``: the user, their count, the limit and its setting."""
    user, limit, named = mine.user, getattr(mine.limits, key), mine.named(key)
    if key == "queued_jobs":
        more = f" and asks for {_n(asking)} more" if asking > 1 else ""
        return (
            f"{user} has {_count(have, 'queued job', 'queued jobs')}{more}, the limit ({named}) "
            f"is {_n(limit)}: wait for some to start, or cancel some"
        )
    if key == "leases":
        return (
            f"{user} holds {_count(have, 'lease', 'leases')} (queued or running), the limit "
            f"({named}) is {_n(limit)}: release one (%gpu release, or shut down a GPU kernel)"
        )
    if key == "streams":
        return (
            f"{user} has {_count(have, 'stream', 'streams')} open (event websockets and log "
            f"follows), the limit ({named}) is {_n(limit)}: close a lab tab, a %gpu status "
            "widget or a log follow"
        )
    if key == "upload_bytes":
        return (
            f"{user} holds {format_size_bytes(have)} of uploaded files and notebooks and sends "
            f"{format_size_bytes(asking)} more, the limit ({named}) is "
            f"{format_size_bytes(limit)}: wait for jobs that carry files to end, or cancel some"
        )
    if key == "submits_per_s":
        return (
            f"{user} sent more than {_n(mine.limits.burst())} requests that create at once, the "
            f"limit ({named}) is {_n(limit)} a second: try again in {_n(math.ceil(asking))} s, "
            "or send many jobs in one request (a list, or array: N)"
        )
    if key == "array_size":
        return (
            f"a bulk submit of {_n(asking)} jobs, the limit ({named}) is {_n(limit)}: "
            "split it into smaller ones"
        )
    raise ValueError(f"no refusal for {key!r}")


def running_reason(user: str, running: int, limit: int) -> str:
    """Why a job waits for its owner's other jobs (``running_jobs``)."""
    return f"waiting: limit ({user} runs {running} of {limit} jobs)"


# --------------------------------------------------------------------------------------------
# How they are shown


def format_value(key: str, value: float | None) -> str:
    """A limit's value for people: ``10,000``, ``2G``, ``20/s``, ``unlimited``."""
    if value is None:
        return "unlimited"
    if key == "upload_bytes":
        return format_size_bytes(value)
    if key == "submits_per_s":
        return f"{_n(value)}/s"
    return _n(value)


#: How each limit is named in words.
_WORDS = {
    "queued_jobs": "queued jobs",
    "running_jobs": "running jobs",
    "array_size": "array size",
    "leases": "leases",
    "streams": "streams",
    "upload_bytes": "uploads",
    "submits_per_s": "submits",
    "submit_burst": "burst",
}


def limits_text(values: Mapping[str, Any] | Limits) -> str:
    """``queued jobs 10,000, running jobs 500, ...``: the keys given, in their order."""
    if isinstance(values, Limits):
        values = {f.name: getattr(values, f.name) for f in fields(Limits)}
    return ", ".join(
        f"{_WORDS[key]} {format_value(key, values[key])}" for key in LIMIT_KEYS if key in values
    )


def describe(policy: LimitPolicy, mine: UserLimits | None = None) -> list[str]:
    """The limit settings in words: a head line, then one line per override (and the caller's).

    For ``jupyter gpusched policy``; the lines after the first belong under it.
    """
    if policy.off:
        return [f"limits per user: none ({EVERYONE})"]
    lines = [f"limits per user ({EVERYONE}): {limits_text(policy.everyone)}"]
    for group in sorted(policy.groups):
        lines.append(f"group {group!r}: {limits_text(policy.groups[group])}")
    if policy.admins:
        lines.append(f"admins: {limits_text(policy.admins)}")
    if policy.users:
        lines.append(f"{len(policy.users)} users with limits of their own")
    if mine is not None:
        groups = f" in {', '.join(mine.groups)}" if mine.groups else ""
        lines.append(f"yours ({mine.user}{groups}): {limits_text(mine.limits)}")
    return lines


# --------------------------------------------------------------------------------------------
# As the API shows them (``GET policy``; part of :class:`.api.PolicyView`)

#: Response bodies send every field (required in the schema), as :class:`.api.Body` does.
_ALWAYS_SENT = ConfigDict(json_schema_serialization_defaults_required=True)


class LimitValues(BaseModel):
    """One user's limits (``GpuSchedPolicy.limits`` keys); null = unlimited."""

    model_config = _ALWAYS_SENT

    queued_jobs: int | None
    running_jobs: int | None
    array_size: int | None
    leases: int | None
    streams: int | None
    upload_bytes: int | None
    submits_per_s: float | None
    submit_burst: int | None


class PolicyLimits(BaseModel):
    """The per-user limits: everyone's, the groups' and admins' overrides, and the caller's."""

    model_config = _ALWAYS_SENT

    everyone: LimitValues
    groups: dict[str, dict[str, float | None]] = Field(
        description="group -> the keys it sets (null: unlimited)"
    )
    admins: dict[str, float | None] = Field(description="the keys set for the queue's admins")
    users_with_own: int = Field(description="how many users have limits of their own")
    yours: LimitValues | None = Field(description="the caller's (null outside a request)")
    your_groups: list[str] = Field(description="the caller's groups that limits know of")
    your_sources: dict[str, str] = Field(
        description="limit key -> the setting that gives the caller's value"
    )


def _values(limits: Limits) -> LimitValues:
    values: dict[str, float | None] = {}
    for key in LIMIT_KEYS:
        value = getattr(limits, key)
        values[key] = value if value is None or key == "submits_per_s" else int(value)
    return LimitValues(**values)


def limits_view(policy: LimitPolicy, mine: UserLimits | None = None) -> PolicyLimits:
    """The limits as the API shows them; ``mine``: the caller's, when a caller asks."""
    return PolicyLimits(
        everyone=_values(policy.everyone),
        groups={g: dict(o) for g, o in sorted(policy.groups.items())},
        admins=dict(policy.admins),
        users_with_own=len(policy.users),
        yours=None if mine is None else _values(mine.limits),
        your_groups=[] if mine is None else sorted(mine.groups),
        your_sources={} if mine is None else dict(mine.sources),
    )
