"""The decision core's settings refuse what they cannot run with, naming the setting (planner.core.config): the
forecast's horizon, history, smoothing and noise, the closed loop's bounds, and a re-buy's fall share of 1 (a fall of
100 % is the traffic gone, not a dip to hold across). Written for the mutants of config.py that survived the suite
(docs/mutation-results.md)."""

from __future__ import annotations

import re

import pytest

from planner.core.config import CoreConfigError, ForecastConfig, RoleConfig, SlaFeedbackConfig


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("horizon_s", -1.0, "forecast.horizon_s must be a finite number >= 0, got -1.0"),
        ("history_s", 0.0, "forecast.history_s must be > 0"),
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


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gain_per_s", -0.1, "sla_feedback.gain_per_s must be >= 0"),
        ("relax_gain_ratio", 1.5, "sla_feedback.relax_gain_ratio must be in [0, 1]"),
        ("min_samples", 0, "sla_feedback.min_samples must be >= 1"),
        ("max_tighten_frac", 1.0, "sla_feedback.max_tighten_frac must be in [0, 1)"),
        ("max_relax_frac", 1.0, "sla_feedback.max_relax_frac must be in [0, 1)"),
        ("decay_s", 0.0, "sla_feedback.decay_s must be > 0"),
        ("max_step_s", float("inf"), "sla_feedback.max_step_s must be > 0"),
        ("windup_settled_actions", -1, "sla_feedback.windup_settled_actions must be >= 0"),
    ],
)
def test_a_closed_loop_setting_it_cannot_run_with_is_refused_by_name(field: str, value: float, message: str) -> None:
    with pytest.raises(CoreConfigError, match=f"^{re.escape(message)}$"):
        SlaFeedbackConfig(**{field: value})  # type: ignore[arg-type]


def test_a_rebuy_fall_share_is_below_one() -> None:
    assert RoleConfig(rebuy_min_fall_frac=0.99).rebuy_min_fall_frac == 0.99
    assert RoleConfig(rebuy_min_fall_frac=0.0).rebuy_min_fall_frac == 0.0
    with pytest.raises(CoreConfigError, match=re.escape("rebuy_min_fall_frac must be in [0, 1), got 1.0")):
        RoleConfig(rebuy_min_fall_frac=1.0)
