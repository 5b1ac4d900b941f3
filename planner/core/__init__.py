"""The decision core: pure functions from an :class:`Observation` to one :class:`Decision` per service.

Public API (stable; later changes are additive only)::

    state = CoreState()
    state, decisions = step(state, Observation(workers=..., fleet=store.snapshot(now), deployments=...),
                            now, CoreConfig())
    msgspec.json.encode(decisions[0])    # the record /v1/decisions/{id}/explain serves

Modules: observation (inputs), reconcile (Coverage), recommend (SLA / threshold), feedback (SLA closed loop),
forecast (predictive floor), clamp (bounds, rate limit, stabilization, GPU budget), safety (coverage, in
flight), decision (records, reasons), config (typed, validated), state, step.
"""

from planner.core.config import (
    Bounds,
    CoreConfig,
    CoreConfigError,
    ForecastConfig,
    ForecastMethod,
    PolicyKind,
    RoleBounds,
    RoleConfig,
    ScaleRules,
    ScalingPolicy,
    SelectPolicy,
    SlaFeedbackConfig,
    SlaTargets,
    ThresholdConfig,
    load_config,
)
from planner.core.decision import (
    Action,
    Coverage,
    Decision,
    Mode,
    Reason,
    RoleInputs,
    Stage,
    StageResult,
    WorkerCoverage,
    WorkerStatus,
)
from planner.core.observation import DeploymentStatus, Observation, ObservationError, RoleLoad, Traffic
from planner.core.state import CoreState, ServiceState
from planner.core.step import step

__all__ = [
    "Action",
    "Bounds",
    "CoreConfig",
    "CoreConfigError",
    "CoreState",
    "Coverage",
    "Decision",
    "DeploymentStatus",
    "ForecastConfig",
    "ForecastMethod",
    "Mode",
    "Observation",
    "ObservationError",
    "PolicyKind",
    "Reason",
    "RoleBounds",
    "RoleConfig",
    "RoleInputs",
    "RoleLoad",
    "ScaleRules",
    "ScalingPolicy",
    "SelectPolicy",
    "ServiceState",
    "SlaFeedbackConfig",
    "SlaTargets",
    "Stage",
    "StageResult",
    "ThresholdConfig",
    "Traffic",
    "WorkerCoverage",
    "WorkerStatus",
    "load_config",
    "step",
]
