"""The records a tick produces: :class:`Decision` per service (one per role in the usual one-service-per-role
fleet), with its :class:`Coverage`, :class:`RoleInputs` and each pipeline :class:`StageResult`.

Every record here is a frozen ``msgspec.Struct`` that encodes to JSON directly
(``msgspec.json.encode(decision)``); every float in them is finite (None stands for "unknown"), so the JSON
never carries NaN. Reasons are :class:`Reason` (a ``StrEnum``), documented one per row in ``docs/reasons.md``.
"""

from __future__ import annotations

import enum

import msgspec

from planner.discovery import Role

__all__ = [
    "Action",
    "Coverage",
    "Decision",
    "Mode",
    "Reason",
    "RoleInputs",
    "Stage",
    "StageResult",
    "WorkerCoverage",
    "WorkerStatus",
]


class Mode(enum.StrEnum):
    """How the recommendation was computed."""

    SLA = "sla"  # perf model predicts TTFT / ITL against the targets
    THRESHOLD = "threshold"  # per-engine load against documented thresholds (no model)
    AUTO = "auto"  # config only: SLA when a ready predictor is given for the role, else threshold


class Action(enum.StrEnum):
    """What the final replica count asks of the deployment."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"


class Stage(enum.StrEnum):
    """The pipeline stages, in the order they run."""

    RECOMMEND = "recommend"  # replicas the load needs (SLA or threshold mode)
    SLA_FEEDBACK = "sla_feedback"  # SLA mode: recommend again with the headroom the observed attainment corrected
    FORECAST = "forecast"  # predictive floor from the forecast request rate
    BOUNDS = "bounds"  # min/max replicas
    RATE_LIMIT = "rate_limit"  # HPA-style scale-up / scale-down policies per period
    STABILIZE = "stabilize"  # HPA-style stabilization windows (seconds)
    SAFETY = "safety"  # no scale-down on missing / stale / unattributable data, or before a full window
    IN_FLIGHT = "in_flight"  # no stacking while an action is in flight; Pending targets may be lowered
    BOUNDS_ENFORCED = "bounds_enforced"  # min/max are hard: bounds changed at run time win over every hold
    GPU_BUDGET = "gpu_budget"  # total GPUs across roles; never reverses a direction


class Reason(enum.StrEnum):
    """Why a stage produced its value. One table in ``docs/reasons.md`` documents every member."""

    # recommend
    LOAD_ABOVE_TARGET = "load_above_target"
    LOAD_BELOW_TARGET = "load_below_target"
    WITHIN_TOLERANCE = "within_tolerance"
    NO_LOAD = "no_load"
    SLA_NEEDS_MORE = "sla_needs_more"
    SLA_ALLOWS_FEWER = "sla_allows_fewer"
    SLA_MET = "sla_met"
    DECODE_BATCH_LIMIT = "decode_batch_limit"
    DECODE_BATCH_OBSERVED = "decode_batch_observed"
    FORECAST_CAPACITY_BEFORE_BATCH_LIMIT = "forecast_capacity_before_batch_limit"
    FORECAST_CAPACITY_HELD_COUNT = "forecast_capacity_held_count"
    SLA_UNREACHABLE = "sla_unreachable"
    PERF_MODEL_NOT_READY = "perf_model_not_ready"
    SILENT_COUNTED_IDLE = "silent_counted_idle"
    LOAD_OVERRIDDEN = "load_overridden"
    LOAD_INVALID = "load_invalid"
    BACKLOG_DRAINS_BEFORE_STARTUP = "backlog_drains_before_startup"
    BACKLOG_OUTLASTS_STARTUP = "backlog_outlasts_startup"
    # sla feedback
    SLA_FEEDBACK_TIGHTENED = "sla_feedback_tightened"
    SLA_FEEDBACK_RELAXED = "sla_feedback_relaxed"
    SLA_FEEDBACK_CLAMPED = "sla_feedback_clamped"
    SLA_FEEDBACK_FROZEN = "sla_feedback_frozen"
    SLA_FEEDBACK_DECAYED = "sla_feedback_decayed"
    SLA_FEEDBACK_HELD = "sla_feedback_held"
    SLA_FEEDBACK_RELAX_BEYOND_RANGE = "sla_feedback_relax_beyond_range"
    SLA_FEEDBACK_WINDUP = "sla_feedback_windup"
    # forecast
    FORECAST_FLOOR = "forecast_floor"
    FORECAST_TREND_DAMPED = "forecast_trend_damped"
    FORECAST_WITHIN_MODEL_CAPACITY = "forecast_within_model_capacity"
    FORECAST_TREND_WITHIN_NOISE = "forecast_trend_within_noise"
    FORECAST_STEADY_WITHIN_MODEL = "forecast_steady_within_model"
    FORECAST_RISE_CAPPED = "forecast_rise_capped"
    FORECAST_BELOW_LOAD = "forecast_below_load"
    FORECAST_NO_DATA = "forecast_no_data"
    # bounds
    CLAMPED_TO_MIN = "clamped_to_min"
    CLAMPED_TO_MAX = "clamped_to_max"
    CAPPED_BY_ACTUATOR_BOUNDS = "capped_by_actuator_bounds"
    # rate limit
    SCALE_UP_RATE_LIMITED = "scale_up_rate_limited"
    SCALE_DOWN_RATE_LIMITED = "scale_down_rate_limited"
    # stabilize
    SCALE_DOWN_STABILIZED = "scale_down_stabilized"
    SCALE_DOWN_HELD_ACROSS_GAPS = "scale_down_held_across_gaps"
    SCALE_UP_STABILIZED = "scale_up_stabilized"
    # safety (coverage)
    IDENTITY_NOT_SYNCED = "identity_not_synced"
    RANKS_MISSING = "ranks_missing"
    WORKERS_SILENT = "workers_silent"
    READY_REPLICAS_UNDISCOVERED = "ready_replicas_undiscovered"
    DEPLOYMENT_STATUS_MISSING = "deployment_status_missing"
    NO_WORKERS_DISCOVERED = "no_workers_discovered"
    COVERAGE_NOT_SUSTAINED = "coverage_not_sustained"
    STARTUP_WINDOW = "startup_window"
    NEW_REPLICAS_HELD = "new_replicas_held"
    SCALE_DOWN_BLOCKED = "scale_down_blocked"
    UNKNOWN_WORKER_SAMPLES = "unknown_worker_samples"
    # in flight
    ACTION_IN_FLIGHT = "action_in_flight"
    IN_FLIGHT_TARGET_RAISED = "in_flight_target_raised"
    IN_FLIGHT_RAISED_FOR_ARRIVALS = "in_flight_raised_for_arrivals"
    PENDING_TARGET_LOWERED = "pending_target_lowered"
    TARGET_NOT_REACHED = "target_not_reached"
    # gpu budget
    GPU_BUDGET_LIMITED = "gpu_budget_limited"
    GPU_BUDGET_EXHAUSTED = "gpu_budget_exhausted"
    # outcome
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"


class StageResult(msgspec.Struct, frozen=True, kw_only=True):
    """One pipeline stage: the replica count it produced, why, and a sentence for people."""

    stage: Stage
    replicas: int
    reason: Reason | None = None  # None: the stage passed its input through unchanged
    detail: str = ""


class WorkerStatus(enum.StrEnum):
    """How reconcile classifies one discovered worker."""

    HEALTHY = "healthy"  # fresh FPM on every rank
    PARTIAL = "partial"  # fresh FPM on some ranks; ``missing_ranks`` names the others
    SILENT = "silent"  # no fresh FPM on any rank
    IDENTITY_NOT_SYNCED = "identity_not_synced"  # its endpoint publishes under "" or a foreign id
    NOT_READY = "not_ready"  # the deployment says the worker is not ready


class WorkerCoverage(msgspec.Struct, frozen=True, kw_only=True):
    """A discovered worker that is not healthy, and why (healthy workers are only counted)."""

    worker_id: str
    status: WorkerStatus
    missing_ranks: tuple[int, ...] = ()  # ranks with no fresh FPM
    published_as: tuple[str, ...] = ()  # the ids its endpoints last published under, when not its own
    detail: str = ""


class Coverage(msgspec.Struct, frozen=True, kw_only=True):
    """Reconcile's verdict for one service: discovered vs FPM-covered vs deployment counts, and every worker
    that is not healthy. ``complete`` is true when every ready replica and rank is covered by fresh,
    attributable FPM (what a scale-down needs)."""

    role: Role
    service: str
    discovered: int
    healthy: int  # FPM-covered: fresh on every rank
    partial: int
    silent: int
    identity_not_synced: int
    not_ready: int
    ranks_expected: int
    ranks_fresh: int
    deployment_desired: int | None  # None: no deployment status this tick
    deployment_ready: int | None
    complete: bool
    gaps: tuple[Reason, ...] = ()  # why it is not complete, most specific first
    problems: tuple[WorkerCoverage, ...] = ()  # every worker that is not healthy, sorted by worker id
    unknown_worker_drops: int = 0  # samples under ids nobody registered (fleet-wide counter)
    empty_worker_id_drops: int = 0  # samples under "" (fleet-wide counter)


class RoleInputs(msgspec.Struct, frozen=True, kw_only=True):
    """The load the recommendation saw, summed over the service's fresh ranks (silent ranks add nothing)."""

    current_replicas: int  # the deployment's desired count (in-flight replicas count as capacity)
    ready_replicas: int
    engines_expected: int  # ranks of discovered workers
    engines_reporting: int  # ranks with fresh FPM
    queued_prefill_tokens: float
    scheduled_prefill_tokens: float
    prefill_token_budget: float  # sum of max_num_batched_tokens over reporting ranks
    decode_requests: float
    queued_decode_requests: float
    decode_seq_budget: float  # sum of max_num_seqs over reporting ranks
    decode_kv_tokens: float
    kv_capacity_tokens: float  # over reporting ranks with a known capacity (0: unknown)
    kv_usage_frac: float | None
    request_rate_per_s: float | None = None
    isl_tokens: float | None = None
    osl_tokens: float | None = None
    forecast_rate_per_s: float | None = None
    predicted_ttft_ms: float | None = None  # SLA mode: upper estimate at the recommended count
    predicted_itl_ms: float | None = None
    overridden: bool = False  # what-if: the load was given, not measured


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One service's decision at one tick, hold or move, with everything needed to explain it.

    ``id`` is ``"{tick}-{service}"`` (unique within one planner run). ``stages`` are in pipeline order;
    ``reasons`` is every reason that shaped the result, in pipeline order (each once), ending with the outcome
    (``scale_up`` / ``scale_down`` / ``hold``); see docs/reasons.md. ``summary`` says it in one sentence,
    naming the workers behind a hold.
    """

    id: str
    tick: int
    at: float
    role: Role
    service: str
    mode: Mode
    current_replicas: int
    recommended_replicas: int
    final_replicas: int
    action: Action
    reasons: tuple[Reason, ...]
    stages: tuple[StageResult, ...]
    coverage: Coverage
    inputs: RoleInputs
    summary: str = ""
    gpus_per_replica: int = 1

    def stage(self, stage: Stage) -> StageResult | None:
        """The result of ``stage``, or None when it did not run."""
        for result in self.stages:
            if result.stage == stage:
                return result
        return None
