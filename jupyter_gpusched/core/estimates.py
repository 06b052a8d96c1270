"""Honest expected starts: what each rests on, a range, and "unknown" where nothing holds.

The backfill (:mod:`.backfill`) plans with one runtime per job. That number alone read as
certain even where it was the 4 h default for a job with no runtime limit, and a running job
that had outlived its estimate was expected to end "now": "starts any moment" while every GPU
stayed busy for another hour. Here each runtime carries its basis (a declared limit, the
owner's past runtimes, or the default guess) and its bounds; the backfill profile is run with
the central, the shortest and the longest runtimes, and each start names the weakest basis
among the ends it waits for on its node. Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from .api import Basis
from .backfill import MAX_EXPECTED, Release, expected_placements, runtime_s
from .models import Job
from .policy import job_gpus
from .units import format_duration_s
from .windows import _aware

# What an expected start rests on (api.Basis), firmest first. ``free``: nothing has to end
# first; ``limits``: declared runtime limits (the latest is firm); ``history``: the owners'
# past runtimes; ``guess``: the default for a job with neither; ``unknown``: nothing to go on.
_RANK: dict[str, int] = {"free": 0, "limits": 1, "history": 2, "guess": 3, "unknown": 4}
#: The runtime assumed for a job with no limit and no history.
DEFAULT_GUESS_S = 4 * 3600.0
#: A runtime with no bound, as the profile takes it: longer than any plan looks ahead.
_FOREVER_S = 3650 * 86400.0
#: Jobs named in one note, at most.
_NAMED = 3


@dataclass(frozen=True)
class Runtime:
    """How long a job is expected to run, and how sure that is."""

    # Central estimate (s): what the backfill plans with.
    s: float
    # Shortest plausible runtime (s).
    low_s: float
    # Longest (s): firm for a limit; None when nothing bounds it.
    high_s: float | None
    # What it rests on: "limits", "history" or "guess".
    basis: Basis


@dataclass(frozen=True)
class End:
    """When a running job is expected to free its GPUs."""

    job_id: int
    # Node the GPUs are on ("*" when placement is count-based).
    node: str
    gpus: float
    # Central expected end (UTC); None: it outlived every estimate and nothing bounds it.
    at: datetime | None
    earliest: datetime
    # Latest end: its deadline or its owner's longest runtime; None when nothing bounds it.
    latest: datetime | None
    basis: Basis


@dataclass(frozen=True)
class StartEstimate:
    """A waiting job's expected start, its range and what it rests on."""

    # Central expected start (UTC); None: unknown.
    at: datetime | None
    # Earliest it could start, if the jobs it waits for end as early as they plausibly can.
    earliest: datetime | None
    # Latest, if they run as long as they may; None when nothing bounds it.
    latest: datetime | None
    basis: Basis
    # In words, for people: what it rests on and, where a guess decides it, what would help.
    note: str


def runtime(
    job: Job,
    history: Iterable[Job | float],
    *,
    percentile: float = 90.0,
    default_s: float = DEFAULT_GUESS_S,
) -> Runtime:
    """A declared ``max_runtime_s``, else a percentile of the owner's past runtimes, else a guess.

    ``history`` holds the owner's finished jobs (or their runtimes in seconds). The central
    figure is :func:`~.backfill.estimate_runtime_s`'s.
    """
    past = sorted(
        x for x in (h if isinstance(h, (int, float)) else runtime_s(h) for h in history) if x
    )
    limit = job.spec.max_runtime_s
    if limit is not None:
        return Runtime(limit, min(past[0], limit) if past else 0.0, limit, "limits")
    if past:
        rank = max(1, math.ceil(percentile / 100.0 * len(past)))  # nearest-rank percentile
        return Runtime(float(past[rank - 1]), float(past[0]), float(past[-1]), "history")
    return Runtime(default_s, 0.0, None, "guess")


def ends_of(
    running: Iterable[Job], runtime_of: Callable[[Job], Runtime], now: datetime
) -> list[End]:
    """Expected ends of running jobs, bounded by their deadlines (a window's limit included).

    A job that has run past its central estimate is expected at its latest end; past that
    too, its end is unknown, unless a deadline stops it (then: any moment).
    """
    now = _aware(now)
    out = []
    for job in running:
        rt = runtime_of(job)
        start = _aware(job.started_at) if job.started_at else now
        deadline = _deadline(job)
        latest = start + timedelta(seconds=rt.high_s) if rt.high_s is not None else None
        at: datetime | None = start + timedelta(seconds=rt.s)
        basis = rt.basis
        if deadline is not None:
            if latest is None or deadline < latest:
                latest = deadline
            if at is None or at > deadline or basis == "guess":
                at, basis = deadline, "limits"
        if at is not None and at < now:  # outlived its estimate
            at = latest if latest is not None and latest >= now else None
            if at is None and deadline is not None:
                at = now  # past its deadline: being stopped
            if at is None:
                basis = "unknown"
        node = job.placement.node if job.placement is not None else "*"
        earliest = max(now, start + timedelta(seconds=rt.low_s))
        if at is not None:
            earliest = min(earliest, at)
        latest = max(now, latest) if latest is not None else None
        out.append(End(job.id, node, job_gpus(job), at, earliest, latest, basis))
    return out


def start_estimates(
    queue: Sequence[Job],
    running: Iterable[Job],
    free_gpus: Mapping[str, float],
    now: datetime,
    *,
    runtime_of: Callable[[Job], Runtime],
    not_before: Mapping[int, datetime] | None = None,
) -> dict[int, StartEstimate | None]:
    """Each waiting job's expected start with its range and basis (None past the profile's cap).

    The backfill profile (:func:`~.backfill.expected_placements`) is run three times: with
    central runtimes (the start), the shortest (the earliest) and the longest (the latest;
    a job with no bound never ends in it, so what waits for it has no latest).
    """
    now = _aware(now)
    ends = ends_of(running, runtime_of, now)
    runtimes = {job.id: runtime_of(job) for job in queue}

    def plan(
        at: Callable[[End], datetime | None], length: Callable[[Runtime], float | None]
    ) -> dict[int, tuple[datetime | None, str | None]]:
        rels = [Release(e.node, e.gpus, t) for e in ends if (t := at(e)) is not None]
        return expected_placements(
            queue,
            rels,
            free_gpus,
            now,
            estimate=lambda j: _or_forever(length(runtimes[j.id])),
            not_before=not_before,
        )

    central = plan(lambda e: e.at, lambda r: r.s)
    early = plan(lambda e: e.earliest, lambda r: r.low_s)
    late = plan(lambda e: e.latest, lambda r: r.high_s)
    horizon = now + timedelta(seconds=_FOREVER_S / 2)
    out: dict[int, StartEstimate | None] = {}
    ahead: list[tuple[datetime, str | None, Basis, int]] = []  # (end, node, basis, job id)
    for i, job in enumerate(queue):
        if i >= MAX_EXPECTED:
            out[job.id] = None
            continue
        start, node = central[job.id]
        floor = max(now, _aware((not_before or {}).get(job.id, now)))
        rt = runtimes[job.id]
        if start is None:
            basis, deciders = "unknown", [e.job_id for e in ends if e.basis == "unknown"]
        elif start <= floor and free_gpus.get(node or "", 0.0) + 1e-9 >= job_gpus(job):
            basis, deciders = "free", []  # free now (or at its not-before time)
        else:
            basis, deciders = _decided_by(start, node, ends, ahead)
        latest = late[job.id][0]
        if start is None or latest is None or latest >= horizon:
            latest = None
        else:
            latest = max(latest, start)
        earliest = early[job.id][0]
        if start is not None:
            earliest = min(earliest, start) if earliest is not None else start
        out[job.id] = StartEstimate(
            start if basis != "unknown" else None,
            earliest,
            latest,
            basis,
            _note(basis, deciders, rt),
        )
        if start is not None:
            end_basis = basis if _RANK[basis] > _RANK[rt.basis] else rt.basis
            ahead.append((start + timedelta(seconds=rt.s), node, end_basis, job.id))
    return out


def _decided_by(
    start: datetime,
    node: str | None,
    ends: Sequence[End],
    ahead: Sequence[tuple[datetime, str | None, Basis, int]],
) -> tuple[Basis, list[int]]:
    """The weakest basis among the ends on ``node`` by ``start``, and the jobs that carry it."""
    found: list[tuple[Basis, int]] = [
        (e.basis, e.job_id)
        for e in ends
        if e.at is not None and e.at <= start and (e.node == node or "*" in (e.node, node))
    ]
    found += [(b, i) for at, n, b, i in ahead if at <= start and (n == node or "*" in (n, node))]
    if not found:
        return "free", []
    weakest = max((b for b, _ in found), key=_RANK.__getitem__)
    return weakest, sorted({i for b, i in found if b == weakest})


def _note(basis: Basis, deciders: Sequence[int], rt: Runtime) -> str:
    """What the start rests on, in words; where a guess decides it, the nudge."""
    named = ", ".join(str(i) for i in deciders[:_NAMED])
    if len(deciders) > _NAMED:
        named += f" and {len(deciders) - _NAMED} more"
    jobs = f"job{'s' if len(deciders) > 1 else ''} {named}"
    own = (
        "; with a --max-runtime this job could also start sooner, in gaps"
        if rt.basis == "guess"
        else ""
    )
    if basis == "free":
        return "GPUs free for it then"
    if basis == "limits":
        return "from declared runtime limits; the latest is firm"
    if basis == "history":
        return f"from past runtimes of the owners' jobs ({jobs})"
    if basis == "guess":
        return (
            f"a guess: {jobs} set no --max-runtime and "
            f"{'have' if len(deciders) > 1 else 'has'} no past runtimes, so "
            f"{format_duration_s(DEFAULT_GUESS_S)} is assumed; set --max-runtime for a firm "
            f"estimate{own}"
        )
    if deciders:
        return (
            f"unknown: {jobs} ran longer than any estimate and set no --max-runtime; "
            f"set --max-runtime for a firm estimate{own}"
        )
    return "unknown: it does not fit even once every running job has ended"


def _deadline(job: Job) -> datetime | None:
    """The running job's deadline (its limit, a window's included), from its handle."""
    raw = job.handle.get("deadline") if isinstance(job.handle, dict) else None
    try:
        return _aware(datetime.fromisoformat(raw)) if isinstance(raw, str) else None
    except ValueError:
        return None


def _or_forever(seconds: float | None) -> float:
    return _FOREVER_S if seconds is None else seconds
