"""HPA ``behavior`` rules (planner.core.scale_rules) refuse what they cannot run with, naming the setting: a
stabilization window that is not a finite number >= 0, and a direction with no policy that is not disabled (the
message says how to forbid scaling that way). Written for the mutants of scale_rules.py that survived the suite
(docs/mutation-results.md)."""

from __future__ import annotations

import re

import pytest

from planner.core.config import CoreConfigError
from planner.core.scale_rules import PolicyKind, ScaleRules, ScalingPolicy, SelectPolicy

POLICY = ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0)


@pytest.mark.parametrize("window_s", [-1.0, float("inf"), float("nan")])
def test_a_stabilization_window_is_a_finite_number_of_seconds(window_s: float) -> None:
    message = f"stabilization_window_s must be a finite number >= 0, got {window_s!r}"
    with pytest.raises(CoreConfigError, match=f"^{re.escape(message)}$"):
        ScaleRules(stabilization_window_s=window_s, policies=(POLICY,))


def test_a_direction_without_policies_must_say_it_is_disabled() -> None:
    message = "policies must not be empty (use select: disabled to forbid scaling in this direction)"
    with pytest.raises(CoreConfigError, match=f"^{re.escape(message)}$"):
        ScaleRules(stabilization_window_s=0.0, policies=())
    disabled = ScaleRules(stabilization_window_s=0.0, policies=(), select=SelectPolicy.DISABLED)
    assert disabled.policies == ()
