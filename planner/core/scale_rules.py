"""HPA ``behavior`` rules of the decision core: scaling policies, a direction's rules, Kubernetes' defaults and
the shipped ones. Validated when built (:class:`planner.core.config_errors.CoreConfigError`); re-exported by
:mod:`planner.core.config`."""

from __future__ import annotations

import enum
import math

import msgspec

from planner.core.config_errors import finite_nonneg, need

__all__ = [
    "PolicyKind",
    "ScaleRules",
    "ScalingPolicy",
    "SelectPolicy",
    "default_scale_down",
    "default_scale_up",
    "hpa_scale_down",
    "hpa_scale_up",
]


class PolicyKind(enum.StrEnum):
    PERCENT = "percent"  # change by at most value% of the replicas at the start of the period
    REPLICAS = "replicas"  # change by at most value replicas per period


class SelectPolicy(enum.StrEnum):
    MAX = "max"  # the policy allowing the largest change wins (HPA default)
    MIN = "min"  # the policy allowing the smallest change wins
    DISABLED = "disabled"  # no change in this direction at all


class ScalingPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One HPA scaling policy: at most ``value`` (percent or replicas) per ``period_s``."""

    kind: PolicyKind
    value: float
    period_s: float

    def __post_init__(self) -> None:
        need(math.isfinite(self.value) and self.value > 0, f"policy value must be > 0, got {self.value!r}")
        need(math.isfinite(self.period_s) and self.period_s > 0, f"period_s must be > 0, got {self.period_s!r}")


class ScaleRules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """HPA ``behavior.scaleUp`` / ``scaleDown``: a stabilization window in seconds and rate-limit policies."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...]
    select: SelectPolicy = SelectPolicy.MAX

    def __post_init__(self) -> None:
        finite_nonneg("stabilization_window_s", self.stabilization_window_s)
        need(
            bool(self.policies) or self.select == SelectPolicy.DISABLED,
            "policies must not be empty (use select: disabled to forbid scaling in this direction)",
        )


def hpa_scale_up() -> ScaleRules:
    """Kubernetes HPA's default scale-up: max(+100 %, +4 pods) per 15 s, no stabilization."""
    return ScaleRules(
        stabilization_window_s=0.0,
        policies=(
            ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),
            ScalingPolicy(kind=PolicyKind.REPLICAS, value=4.0, period_s=15.0),
        ),
    )


def hpa_scale_down() -> ScaleRules:
    """Kubernetes HPA's default scale-down: 100 % per 15 s, stabilization over the last 300 s."""
    return ScaleRules(
        stabilization_window_s=300.0,
        policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),),
    )


def default_scale_up() -> ScaleRules:
    # Shipped default: the whole recommendation at once. A replica takes a start-up to serve and no action stacks
    # while one is in flight (unless the rate grew), so capping a scale-up at +100 % per 15 s only delays
    # capacity by whole start-ups.
    return ScaleRules(
        stabilization_window_s=0.0,
        policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=900.0, period_s=15.0),),
    )


def default_scale_down() -> ScaleRules:
    # Shipped default: 100 % per 15 s; the window is two start-ups (RoleConfig.scale_down_window_startups), 120 s
    # with a 60 s cold start: a scale-down made on a dip costs one start-up to undo.
    return ScaleRules(
        stabilization_window_s=120.0,
        policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),),
    )
