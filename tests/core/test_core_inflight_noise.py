"""The in-flight raise for the request rate's growth (``in_flight_target_raised``) asks that the growth exceed the
counting noise of the two traffic windows (3 standard deviations of their Poisson request counts over
``traffic_window_s``, 10 s), not only the 20 % threshold: at a trickle, while the first replicas start, a 20 %
growth is a count of one or two requests."""

from __future__ import annotations

import pytest

from planner.core import (
    Action,
    CoreConfig,
    CoreState,
    Mode,
    Reason,
    RoleConfig,
    Traffic,
)
from planner.discovery import Role
from tests.core.fleetkit import FAST_UP, Fleet, Load

CONFIG = CoreConfig(roles={Role.DECODE: RoleConfig(mode=Mode.THRESHOLD, max_replicas=64, scale_up=FAST_UP)})


def _in_flight_after(rate_then_per_s: float, rate_now_per_s: float) -> tuple[int, tuple[Reason, ...]]:
    """A decode fleet scaled 2 -> 4 at ``rate_then_per_s``; while the two new replicas start the load doubles and
    the rate is ``rate_now_per_s``: the count and reasons of that tick."""
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    state = CoreState()
    fleet.publish_all(0.0, Load(decode=4 * 204))
    state, d = fleet.tick(state, 0.0, CONFIG, {Role.DECODE: Traffic(request_rate_per_s=rate_then_per_s)})
    assert d["decode"].action == Action.SCALE_UP and d["decode"].final_replicas == 4
    fleet.deploy("decode", 4, ready=2)  # in flight
    fleet.publish_all(5.0, Load(decode=10 * 204))
    _, d = fleet.tick(state, 5.0, CONFIG, {Role.DECODE: Traffic(request_rate_per_s=rate_now_per_s)})
    return d["decode"].final_replicas, tuple(d["decode"].reasons)


def test_a_trickle_that_doubled_is_within_the_noise_and_does_not_raise() -> None:
    # 0.15 -> 0.3 req/s: 1.5 -> 3 requests a window, a growth of 1.5 against 3 sd of sqrt(4.5) = 6.4
    replicas, reasons = _in_flight_after(0.15, 0.3)
    assert replicas == 4
    assert Reason.ACTION_IN_FLIGHT in reasons and Reason.IN_FLIGHT_TARGET_RAISED not in reasons


@pytest.mark.parametrize(
    ("rate_now_per_s", "replicas", "reason"),
    [
        # 10 -> 20 requests a window: a growth of 10 against 3 sqrt(30) = 16.4, noise
        (2.0, 4, Reason.ACTION_IN_FLIGHT),
        # 10 -> 30: 20 against 3 sqrt(40) = 19.0, beyond it: raised to 4 x 3 = 12
        (3.0, 12, Reason.IN_FLIGHT_TARGET_RAISED),
    ],
)
def test_the_growth_must_exceed_three_standard_errors_of_both_windows(
    rate_now_per_s: float, replicas: int, reason: Reason
) -> None:
    got, reasons = _in_flight_after(1.0, rate_now_per_s)
    assert got == replicas and reason in reasons


def test_a_growth_well_beyond_the_noise_still_raises() -> None:
    # 100 -> 250 requests a window: 150 against 3 sqrt(350) = 56: raised to 4 x 2.5
    got, reasons = _in_flight_after(10.0, 25.0)
    assert got == 10 and Reason.IN_FLIGHT_TARGET_RAISED in reasons
