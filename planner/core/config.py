"""Typed configuration of the decision core, per role, with Kubernetes HPA defaults; validated when built.

Every struct is frozen and validates itself in ``__post_init__``: constructing one with a bad value raises
:class:`CoreConfigError` (a :class:`planner.errors.ConfigError`) naming the field. :func:`load_config` builds
a :class:`CoreConfig` from plain data (YAML / JSON) and reports unknown fields and type errors the same way.

Bounds (min/max per role, GPU budget) change at run time (``PATCH /v1/bounds``): the caller builds a new
config with :meth:`CoreConfig.with_bounds` and passes it to the next :func:`planner.core.step` call;
nothing is cached between ticks except :class:`planner.core.CoreState`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import msgspec

from planner.core.config_errors import CoreConfigError, finite_nonneg, need
from planner.core.decision import Mode
from planner.core.scale_rules import (
    PolicyKind,
    ScaleRules,
    ScalingPolicy,
    SelectPolicy,
    default_scale_down,
    default_scale_up,
    hpa_scale_down,
    hpa_scale_up,
)
from planner.discovery import Role

__all__ = [
    "Bounds",
    "CoreConfig",
    "CoreConfigError",
    "ForecastConfig",
    "ForecastMethod",
    "PolicyKind",
    "RoleBounds",
    "RoleConfig",
    "ScaleRules",
    "ScalingPolicy",
    "SelectPolicy",
    "SlaFeedbackConfig",
    "SlaTargets",
    "ThresholdConfig",
    "hpa_scale_down",
    "hpa_scale_up",
    "load_config",
]


class SlaTargets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Latency targets of SLA mode. Prefill checks TTFT, decode ITL, aggregated both."""

    ttft_ms: float = 500.0
    itl_ms: float = 50.0

    def __post_init__(self) -> None:
        need(math.isfinite(self.ttft_ms) and self.ttft_ms > 0, f"ttft_ms must be > 0, got {self.ttft_ms!r}")
        need(math.isfinite(self.itl_ms) and self.itl_ms > 0, f"itl_ms must be > 0, got {self.itl_ms!r}")


class ThresholdConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Threshold mode (no perf model): per-engine (per DP rank) load against targets, HPA's ratio rule
    ``desired = ceil(current * observed / target)`` per metric, the largest wins. See docs/decision_core.md.

    - ``queued_prefill_tokens_per_engine``: queued (not yet scheduled) prefill tokens per engine.
      (prefill, agg)
    - ``prefill_budget_frac``: prefill tokens computed per step / ``max_num_batched_tokens``. (prefill, agg)
    - ``kv_usage_frac``: decode KV tokens / ``kv_capacity_tokens`` (skipped when the capacity is unknown).
      (decode, agg)
    - ``decode_seq_frac``: running decode requests / ``max_num_seqs``. (decode, agg)
    - ``queued_decode_requests_per_engine``: preempted or KV-waiting decode requests per engine. (decode, agg)
    - ``tolerance_frac``: no change while every ratio is within 1 +/- tolerance (HPA: 0.1).
    """

    queued_prefill_tokens_per_engine: float = 2048.0
    prefill_budget_frac: float = 0.8
    kv_usage_frac: float = 0.75
    decode_seq_frac: float = 0.8
    queued_decode_requests_per_engine: float = 1.0
    tolerance_frac: float = 0.1

    def __post_init__(self) -> None:
        for name in (
            "queued_prefill_tokens_per_engine",
            "prefill_budget_frac",
            "kv_usage_frac",
            "decode_seq_frac",
            "queued_decode_requests_per_engine",
        ):
            value = getattr(self, name)
            need(math.isfinite(value) and value > 0, f"threshold.{name} must be > 0, got {value!r}")
        need(0 <= self.tolerance_frac < 1, f"tolerance_frac must be in [0, 1), got {self.tolerance_frac!r}")


class ForecastMethod(enum.StrEnum):
    NONE = "none"  # no predictive floor
    CONSTANT = "constant"  # next interval = the latest rate
    LINEAR = "linear"  # least-squares trend over the history window, extrapolated by horizon_s
    HOLT = "holt"  # Holt's double exponential smoothing (level + trend)
    KALMAN = "kalman"  # local linear trend Kalman filter (level + slope)


class ForecastConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Predictive floor: forecast the request rate ``horizon_s`` ahead; floor = ceil(rate / capacity).

    ``replica_capacity_rps``: requests per second one replica serves at the SLA; None derives it each tick
    from the load-based recommendation (current rate / recommended replicas).
    """

    method: ForecastMethod = ForecastMethod.HOLT  # shipped default: Holt's trend, one start-up (60 s) ahead
    horizon_s: float = 60.0
    history_s: float = 600.0
    alpha: float = 0.5  # Holt level smoothing
    beta: float = 0.3  # Holt trend smoothing
    process_noise: float = 0.01  # Kalman: relative process noise of level and slope
    measurement_noise: float = 0.1  # Kalman: relative measurement noise
    replica_capacity_rps: float | None = None

    def __post_init__(self) -> None:
        finite_nonneg("forecast.horizon_s", self.horizon_s)
        need(math.isfinite(self.history_s) and self.history_s > 0, "forecast.history_s must be > 0")
        need(0 < self.alpha <= 1 and 0 <= self.beta <= 1, "forecast.alpha must be in (0, 1], beta in [0, 1]")
        need(math.isfinite(self.process_noise) and self.process_noise > 0, "forecast.process_noise must be > 0")
        need(
            math.isfinite(self.measurement_noise) and self.measurement_noise > 0,
            "forecast.measurement_noise must be > 0",
        )
        if self.replica_capacity_rps is not None:
            need(
                math.isfinite(self.replica_capacity_rps) and self.replica_capacity_rps > 0,
                "forecast.replica_capacity_rps must be > 0",
            )


class SlaFeedbackConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """SLA mode's closed loop (see :mod:`planner.core.feedback`): a bounded integral correction of the TTFT and ITL
    headroom from the observed attainment (``Traffic.ttft_attainment_frac`` / ``itl_attainment_frac``).

    - ``attainment_goal``: the fraction of requests that must meet each target.
    - ``gain_per_s``: headroom added per second per unit of attainment shortfall (0.3: 95 % observed against a
      99 % goal tightens by 0.06 of the target per 5 s tick). Chosen on the replays (docs/benchmarks.md:
      Mooncake x5 96.7 / 98.2 / 98.8 % attainment at 0.03 / 0.1 / 0.3).
    - ``relax_gain_ratio``: relaxing (attainment above the goal) integrates this fraction of the gain: the loop
      probes for spare capacity slowly, since each probe below the boundary costs misses (100 % observed relaxes
      by 0.018 of the target per minute).
    - ``min_samples``: requests an attainment must rest on before it moves the correction.
    - ``max_tighten_frac`` / ``max_relax_frac``: the correction stays in ``[-max_relax_frac, max_tighten_frac]``
      (anti-windup; the total headroom also stays below 0.95).
    - ``decay_s``: with no usable observation the correction decays toward 0 with this time constant.
    - ``max_step_s``: the longest gap between two ticks one update integrates over.
    - ``windup_settled_actions``: a correction at its tighten bound is wound up once this many actions settled
      there without raising the observed attainment past its noise (:mod:`planner.core.windup`): the count is
      then held (0: never). One settled action is weak evidence (the load moved meanwhile, the window is noisy);
      measured at 1 / 2 / 3 on Mooncake x5 disaggregated restored: -0.90 / -0.31 / -0.01 points (docs/benchmarks.md).
    """

    enabled: bool = True
    attainment_goal: float = 0.99
    gain_per_s: float = 0.3
    relax_gain_ratio: float = 0.1
    min_samples: int = 20
    max_tighten_frac: float = 0.6
    max_relax_frac: float = 0.3
    decay_s: float = 600.0
    max_step_s: float = 30.0
    windup_settled_actions: int = 3

    def __post_init__(self) -> None:
        need(
            0 < self.attainment_goal <= 1,
            f"sla_feedback.attainment_goal must be in (0, 1], got {self.attainment_goal!r}",
        )
        need(math.isfinite(self.gain_per_s) and self.gain_per_s >= 0, "sla_feedback.gain_per_s must be >= 0")
        need(0 <= self.relax_gain_ratio <= 1, "sla_feedback.relax_gain_ratio must be in [0, 1]")
        need(self.min_samples >= 1, "sla_feedback.min_samples must be >= 1")
        need(0 <= self.max_tighten_frac < 1, "sla_feedback.max_tighten_frac must be in [0, 1)")
        need(0 <= self.max_relax_frac < 1, "sla_feedback.max_relax_frac must be in [0, 1)")
        need(math.isfinite(self.decay_s) and self.decay_s > 0, "sla_feedback.decay_s must be > 0")
        need(math.isfinite(self.max_step_s) and self.max_step_s > 0, "sla_feedback.max_step_s must be > 0")
        need(self.windup_settled_actions >= 0, "sla_feedback.windup_settled_actions must be >= 0")


class RoleBounds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replica bounds of one role (what ``/v1/bounds`` reads and replaces)."""

    min_replicas: int = 1
    max_replicas: int = 64

    def __post_init__(self) -> None:
        need(
            0 <= self.min_replicas <= self.max_replicas,
            f"need 0 <= min_replicas <= max_replicas, got [{self.min_replicas}, {self.max_replicas}]",
        )


class Bounds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds of every role plus the GPU budget (``max_total_gpus``; None = unlimited)."""

    roles: dict[Role, RoleBounds] = msgspec.field(default_factory=dict)
    max_total_gpus: int | None = None

    def __post_init__(self) -> None:
        need(
            self.max_total_gpus is None or self.max_total_gpus >= 0,
            f"max_total_gpus must be >= 0, got {self.max_total_gpus!r}",
        )


class RoleConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything one role's decision needs apart from the observation."""

    min_replicas: int = 1
    max_replicas: int = 64
    gpus_per_replica: int = 1
    mode: Mode = Mode.AUTO
    service: str | None = None  # deployment service when no worker of the role is discovered
    sla: SlaTargets = msgspec.field(default_factory=SlaTargets)
    threshold: ThresholdConfig = msgspec.field(default_factory=ThresholdConfig)
    forecast: ForecastConfig = msgspec.field(default_factory=ForecastConfig)
    sla_feedback: SlaFeedbackConfig = msgspec.field(default_factory=SlaFeedbackConfig)
    scale_up: ScaleRules = msgspec.field(default_factory=default_scale_up)
    scale_down: ScaleRules = msgspec.field(default_factory=default_scale_down)
    # A target the pods have not reached after this long is reported as target_not_reached.
    pending_timeout_s: float = 300.0
    # SLA mode: predictions must be at most (1 - headroom_frac) x target, on top of the model's upper band.
    headroom_frac: float = 0.0
    # Seconds from a scale-up's decision to its replicas serving (cold start; a snapshot restore is shorter). The core
    # uses the delay it measures from the deployment's desired -> ready transitions once it has seen one.
    startup_s: float = 60.0
    # When set, the scale-down stabilization window is this many start-ups (measured, else startup_s) instead of
    # scale_down.stabilization_window_s: capacity released on a dip costs one start-up to buy back, so a faster
    # start-up (snapshot restore) makes the planner leaner by itself.
    scale_down_window_startups: float | None = 2.0
    # Cost-aware scale-down across idle gaps: when capacity released was bought back after a gap of g seconds (a
    # scale-up within this long of a scale-down) in the last 30 minutes, the scale-down window grows to 1.5 g (at
    # most this long) and, beyond it, a scale-down goes no lower than the highest recommendation of this long, up
    # to the most that came back: capacity the recent history says comes back is not released.
    # None: the window stays as configured.
    hold_across_gaps_max_s: float | None = 600.0
    # A scale-up buys capacity back across a gap only when the traffic fell between the release and the re-buy: the
    # lowest request rate seen since the release is at most (1 - this) x the rate at the re-buy. A trim while the
    # traffic held, bought back at the same traffic, is the recommendation moving, not a gap. None: every re-buy
    # counts (also when no request rate is known).
    rebuy_min_fall_frac: float | None = 0.25
    # An in-flight scale-up's target may be raised (in_flight_target_raised) when the request rate grew by at least
    # this fraction since it was decided, in proportion to that growth; None: never (no stacking at all).
    in_flight_raise_rate_growth_frac: float | None = 0.2
    # SLA mode: the engines' prefill chunk (max_num_batched_tokens) when no engine of the role reports one (no
    # worker discovered, e.g. a what-if on an empty role); vLLM's default for online serving.
    default_max_num_batched_tokens: int = 8192
    # SLA mode, prefill role: the time constant of the prompt-length spread's EWMA (planner.core.prompt_spread) that
    # sizes the prefill queue's wait (Pollaczek-Khinchine); 0: the spread is not used (an M/D/1 wait at the mean).
    prompt_spread_window_s: float = 120.0
    # The actuator's hard bounds for this role's deployment (None: not given). The core's effective bounds are the
    # intersection with min_replicas/max_replicas (reason capped_by_actuator_bounds); set them with
    # CoreConfig.with_actuator_bounds, which refuses bounds that do not intersect.
    actuator_bounds: RoleBounds | None = None
    # SLA mode: the ITL check's own headroom (None: headroom_frac). The models predict the MEAN ITL of an engine's
    # sequences while the SLA is per request: the spread of request ITLs around that mean (a short request
    # decoding through a long prompt's chunks) is ITL-specific, so it gets its own margin.
    # Shipped default None: the per-request tail model (planner.core.tail: the share of requests whose own ITL
    # misses, from the traffic's OSL distribution) is the margin, and the closed loop (sla_feedback) corrects
    # what remains from the observed attainment. (Was a constant 0.7, calibrated on one trace.)
    itl_headroom_frac: float | None = None
    # The sliding window the traffic (rate, ISL/OSL distribution, observed attainment) is read over, from the FPM
    # traffic extension (planner.ingest.traffic). Short: a shift shows within it; long: fewer, steadier samples.
    # 10 s was chosen against 30 s on Mooncake, Azure and three scenarios together (docs/benchmarks.md).
    traffic_window_s: float = 10.0

    def __post_init__(self) -> None:
        need(
            0 <= self.min_replicas <= self.max_replicas,
            f"need 0 <= min_replicas <= max_replicas, got [{self.min_replicas}, {self.max_replicas}]",
        )
        need(self.gpus_per_replica >= 0, f"gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
        finite_nonneg("pending_timeout_s", self.pending_timeout_s)
        need(0 <= self.headroom_frac < 1, f"headroom_frac must be in [0, 1), got {self.headroom_frac!r}")
        need(
            self.itl_headroom_frac is None or 0 <= self.itl_headroom_frac < 1,
            f"itl_headroom_frac must be in [0, 1), got {self.itl_headroom_frac!r}",
        )
        finite_nonneg("startup_s", self.startup_s)
        need(
            math.isfinite(self.traffic_window_s) and self.traffic_window_s > 0,
            f"traffic_window_s must be > 0, got {self.traffic_window_s!r}",
        )
        need(
            self.scale_down_window_startups is None
            or (math.isfinite(self.scale_down_window_startups) and self.scale_down_window_startups >= 0),
            f"scale_down_window_startups must be >= 0, got {self.scale_down_window_startups!r}",
        )
        need(
            self.hold_across_gaps_max_s is None
            or (math.isfinite(self.hold_across_gaps_max_s) and self.hold_across_gaps_max_s >= 0),
            f"hold_across_gaps_max_s must be >= 0, got {self.hold_across_gaps_max_s!r}",
        )
        need(
            self.rebuy_min_fall_frac is None or 0 <= self.rebuy_min_fall_frac < 1,
            f"rebuy_min_fall_frac must be in [0, 1), got {self.rebuy_min_fall_frac!r}",
        )
        need(
            self.in_flight_raise_rate_growth_frac is None
            or (math.isfinite(self.in_flight_raise_rate_growth_frac) and self.in_flight_raise_rate_growth_frac > 0),
            f"in_flight_raise_rate_growth_frac must be > 0, got {self.in_flight_raise_rate_growth_frac!r}",
        )
        need(
            self.default_max_num_batched_tokens >= 1,
            f"default_max_num_batched_tokens must be >= 1, got {self.default_max_num_batched_tokens!r}",
        )
        need(
            math.isfinite(self.prompt_spread_window_s) and self.prompt_spread_window_s >= 0,
            f"prompt_spread_window_s must be >= 0, got {self.prompt_spread_window_s!r}",
        )
        a = self.actuator_bounds
        need(
            a is None or (a.min_replicas <= self.max_replicas and self.min_replicas <= a.max_replicas),
            f"bounds [{self.min_replicas}, {self.max_replicas}] do not intersect the actuator's"
            f" [{a.min_replicas if a else 0}, {a.max_replicas if a else 0}]",
        )

    @property
    def bounds(self) -> RoleBounds:
        return RoleBounds(min_replicas=self.min_replicas, max_replicas=self.max_replicas)

    @property
    def effective_bounds(self) -> RoleBounds:
        """The bounds the core decides within: its own, intersected with the actuator's when given."""
        a = self.actuator_bounds
        if a is None:
            return self.bounds
        return RoleBounds(
            min_replicas=max(self.min_replicas, a.min_replicas), max_replicas=min(self.max_replicas, a.max_replicas)
        )


def _default_roles() -> dict[Role, RoleConfig]:
    return {role: RoleConfig() for role in Role}


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The decision core's configuration: one :class:`RoleConfig` per role and the fleet-wide GPU budget."""

    roles: dict[Role, RoleConfig] = msgspec.field(default_factory=_default_roles)
    max_total_gpus: int | None = None  # GPU budget over every role; None = unlimited

    def __post_init__(self) -> None:
        need(
            self.max_total_gpus is None or self.max_total_gpus >= 0,
            f"max_total_gpus must be >= 0, got {self.max_total_gpus!r}",
        )
        # Roles left out get the defaults (on a copy: the caller's dict is left alone).
        if any(role not in self.roles for role in Role):
            roles = {role: self.roles.get(role) or RoleConfig() for role in Role}
            msgspec.structs.force_setattr(self, "roles", roles)

    def role(self, role: Role) -> RoleConfig:
        return self.roles.get(role) or RoleConfig()

    @property
    def traffic_window_s(self) -> float:
        """The window the FPM traffic is read over: the longest any role asks for (one set of windows serves
        every service)."""
        return max((rc.traffic_window_s for rc in self.roles.values()), default=RoleConfig().traffic_window_s)

    def bounds(self) -> Bounds:
        """The run-time adjustable part: min/max per role and the GPU budget."""
        return Bounds(roles={role: rc.bounds for role, rc in self.roles.items()}, max_total_gpus=self.max_total_gpus)

    def with_bounds(self, bounds: Bounds) -> CoreConfig:
        """A new config with ``bounds`` applied (roles ``bounds`` does not name keep theirs). Raises
        :class:`CoreConfigError` when a role's new bounds do not validate."""
        roles = dict(self.roles)
        for role, rb in bounds.roles.items():
            roles[role] = msgspec.structs.replace(
                roles.get(role) or RoleConfig(), min_replicas=rb.min_replicas, max_replicas=rb.max_replicas
            )
        return CoreConfig(roles=roles, max_total_gpus=bounds.max_total_gpus)

    def with_actuator_bounds(self, bounds: Mapping[Role, RoleBounds]) -> CoreConfig:
        """A new config deciding within the actuator's hard bounds too: each role's effective bounds become the
        intersection of its own and ``bounds[role]`` (a count past the actuator's max is capped there, reason
        ``capped_by_actuator_bounds``, instead of being refused every tick). Roles not named keep what they had.
        Raises :class:`CoreConfigError` when a role's bounds and the actuator's do not intersect: the service
        refuses such a configuration at start."""
        roles = dict(self.roles)
        for role, rb in bounds.items():
            roles[role] = msgspec.structs.replace(roles.get(role) or RoleConfig(), actuator_bounds=rb)
        return CoreConfig(roles=roles, max_total_gpus=self.max_total_gpus)


def load_config(data: Mapping[str, Any]) -> CoreConfig:
    """Build a :class:`CoreConfig` from plain data; raises :class:`CoreConfigError` naming the field (unknown
    fields included)."""
    try:
        return msgspec.convert(dict(data), CoreConfig)
    except msgspec.ValidationError as exc:
        raise CoreConfigError(f"invalid decision-core config: {exc}") from exc
