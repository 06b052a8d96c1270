"""Fair-share usage and today's GPU-hours, with finished stretches summed once across passes.

Every placing pass weighs a fortnight of usage stretches (:func:`.policy.fair_share_usage`,
:func:`.policy.gpu_hours_today`); a busy lab ends thousands of jobs in a fortnight, and
summing each one's decay on every pass made a pass grow with the lab's history. A finished
stretch never changes, and its decayed GPU-seconds factor as ``exp(-rate * now)`` times a
constant, so :class:`UsageTally` keeps per-user sums of those constants (relative to a
reference instant) and of today's GPU-hours, adds the stretches that appear, takes away those
that leave the window, and computes only the open stretches afresh. Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from .policy import UsageLike, fair_share_usage, gpu_hours_today, local_day_start
from .windows import PolicyConfig, _aware

#: Re-base the sums once the reference instant is this many e-foldings old: the kept
#: constants grow as ``exp(rate * (end - reference))``.
_REBASE_EFOLDINGS = 20.0


class UsageTally:
    """What :func:`.policy.fair_share_usage` and :func:`.policy.gpu_hours_today` answer.

    Give :meth:`totals` every stretch in the window, by the store's id, on each pass; the
    answers equal those functions' over the same stretches (up to float rounding).
    """

    def __init__(self) -> None:
        self._key: tuple[float, datetime] | None = None  # (half-life, local day start)
        self._reset(datetime.min)

    def _reset(self, ref: datetime) -> None:
        self._ref = ref  # the instant the decay sums are relative to
        self._kept: dict[int, tuple[str, float, float]] = {}  # id: (user, decay term, today)
        self._decay: dict[str, float] = {}  # per user, GPU-seconds at the reference instant
        self._today: dict[str, float] = {}  # per user, GPU-hours since local midnight
        self._count: dict[str, int] = {}  # per user, stretches kept

    def totals(
        self,
        stretches: Mapping[int, UsageLike],
        config: PolicyConfig,
        now: datetime,
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Decayed GPU-hours per user, and GPU-hours per user since local midnight."""
        now = _aware(now)
        half_life = config.fairshare_half_life_s
        rate = math.log(2) / half_life
        key = (half_life, local_day_start(config, now))
        if key != self._key or rate * (now - self._ref).total_seconds() > _REBASE_EFOLDINGS:
            self._key = key
            self._reset(now)
        open_ = []
        finished: set[int] = set()
        for sid, stretch in stretches.items():
            end = stretch[3]
            if end is None or end > now:
                open_.append(stretch)
            else:
                finished.add(sid)
                if sid not in self._kept:
                    self._keep(sid, stretch, rate, key[1])
        for sid in self._kept.keys() - finished:  # left the window
            self._drop(sid)
        scale = math.exp(-rate * (now - self._ref).total_seconds()) / 3600.0
        decayed = {user: total * scale for user, total in self._decay.items()}
        for user, hours in fair_share_usage(open_, half_life, now).items():
            decayed[user] = decayed.get(user, 0.0) + hours
        today = dict(self._today)
        for user, hours in gpu_hours_today(open_, config, now).items():
            today[user] = today.get(user, 0.0) + hours
        return decayed, {user: hours for user, hours in today.items() if hours > 0}

    def _keep(self, sid: int, stretch: UsageLike, rate: float, day_start: datetime) -> None:
        user, gpus, start, end = stretch
        assert end is not None
        start = min(start, end)
        at_end = (end - self._ref).total_seconds()
        at_start = (start - self._ref).total_seconds()
        decay = gpus * (math.exp(rate * at_end) - math.exp(rate * at_start)) / rate
        lo = max(start, day_start)
        today = gpus * (end - lo).total_seconds() / 3600.0 if end > lo else 0.0
        self._kept[sid] = (user, decay, today)
        self._decay[user] = self._decay.get(user, 0.0) + decay
        self._today[user] = self._today.get(user, 0.0) + today
        self._count[user] = self._count.get(user, 0) + 1

    def _drop(self, sid: int) -> None:
        user, decay, today = self._kept.pop(sid)
        self._count[user] -= 1
        if not self._count[user]:  # exactly nothing left, not a rounding residue
            del self._count[user], self._decay[user], self._today[user]
            return
        self._decay[user] -= decay
        self._today[user] -= today
