"""The decision core's settings refuse what they cannot run with, naming the setting (planner.core.config): the
forecast's smoothing and noise settings, and a re-buy's fall share of 1 (a fall of 100 % is the traffic gone, not a
dip to hold across). Written for the mutants of config.py that survived the suite (docs/mutation-results.md)."""

from __future__ import annotations

import re

import pytest

from planner.core.config import CoreConfigError, ForecastConfig, RoleConfig


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("alpha", 0.0, "forecast.alpha must be in (0, 1], beta in [0, 1]"),
        ("beta", 1.5, "forecast.alpha must be in (0, 1], beta in [0, 1]"),
        ("process_noise", 0.0, "forecast.process_noise must be > 0"),
        ("process_noise", float("inf"), "forecast.process_noise must be > 0"),
        ("measurement_noise", 0.0, "forecast.measurement_noise must be > 0"),
        ("measurement_noise", float("nan"), "forecast.measurement_noise must be > 0"),
    ],
)
def test_a_forecast_setting_it_cannot_run_with_is_refused_by_name(field: str, value: float, message: str) -> None:
    with pytest.raises(CoreConfigError, match=f"^{re.escape(message)}$"):
        ForecastConfig(**{field: value})  # type: ignore[arg-type]


def test_a_rebuy_fall_share_is_below_one() -> None:
    assert RoleConfig(rebuy_min_fall_frac=0.99).rebuy_min_fall_frac == 0.99
    assert RoleConfig(rebuy_min_fall_frac=0.0).rebuy_min_fall_frac == 0.0
    with pytest.raises(CoreConfigError, match=re.escape("rebuy_min_fall_frac must be in [0, 1), got 1.0")):
        RoleConfig(rebuy_min_fall_frac=1.0)
