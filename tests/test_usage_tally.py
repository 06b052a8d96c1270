"""The usage tally a pass keeps answers what the fair-share and quota functions answer."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from jupyter_gpusched.core.policy import UsageRecord, fair_share_usage, gpu_hours_today
from jupyter_gpusched.core.usage import UsageTally
from jupyter_gpusched.core.windows import PolicyConfig

T0 = datetime(2026, 11, 23, 20, 0, tzinfo=UTC)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("half_life_h", [0.5, 24.0, 7 * 24.0])
def test_the_tally_equals_summing_every_stretch_as_they_start_end_and_leave(
    seed: int, half_life_h: float
) -> None:
    # Three days in 10-minute passes across local midnights (Berlin), a one-day window:
    # stretches start, end (some in the future: still open), and leave the window.
    rng = random.Random(seed)
    config = PolicyConfig(fairshare_half_life_s=half_life_h * 3600, timezone="Europe/Berlin")
    tally = UsageTally()
    stretches: dict[int, UsageRecord] = {}
    now = T0
    for step in range(3 * 24 * 6):
        now += timedelta(minutes=10)
        for _ in range(rng.randint(0, 3)):
            start = now - timedelta(minutes=rng.randint(0, 120))
            end = None if rng.random() < 0.3 else start + timedelta(minutes=rng.randint(0, 240))
            user = rng.choice(["ann", "bob", "cy"])
            stretches[len(stretches) + 1] = UsageRecord(
                user, rng.choice([0.5, 1.0, 4.0]), start, end
            )
        for sid, s in list(stretches.items()):
            if s.end is None and rng.random() < 0.1:
                stretches[sid] = s._replace(end=now)
        window = {
            sid: s
            for sid, s in stretches.items()
            if s.end is None or s.end >= now - timedelta(days=1)
        }
        decayed, today = tally.totals(window, config, now)
        want_decayed = fair_share_usage(window.values(), config.fairshare_half_life_s, now)
        want_today = gpu_hours_today(window.values(), config, now)
        assert decayed.keys() == want_decayed.keys(), step
        for user, value in want_decayed.items():
            assert decayed[user] == pytest.approx(value, rel=1e-9, abs=1e-9), (step, user)
        assert today.keys() == want_today.keys(), step
        for user, value in want_today.items():
            assert today[user] == pytest.approx(value, rel=1e-9, abs=1e-9), (step, user)
