"""Row for planner/core/startup.py's ``traffic_fell`` (docs/testing.md, mutation testing): a re-buy follows a fall of
the traffic only when the fall itself (not the two rates together) is beyond one window's counting noise. Fails on
``traffic_fell`` mutant 11 (the rise computed as a sum)."""

from __future__ import annotations

from planner.core.config import RoleConfig
from planner.core.startup import traffic_fell

RC = RoleConfig()  # a re-buy after a fall of at least 25 %, 10 s traffic windows


def test_a_fall_of_exactly_three_sd_of_the_rebuys_count_is_no_fall() -> None:
    """10 req/s at the re-buy, 7 at the lowest: 30 fewer requests a window against 3 sqrt(100) = 30."""
    assert not traffic_fell(RC, 7.0, 10.0)
    assert traffic_fell(RC, 6.9, 10.0)
