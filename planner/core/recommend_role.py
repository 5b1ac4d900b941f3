"""The recommend stage's call for one role: SLA mode when the role's mode and its perf model allow it, else
threshold mode (with ``perf_model_not_ready`` when SLA mode was asked for). Pure; :mod:`planner.core.draft` calls it
for the load, again with the closed loop's corrections, and :mod:`planner.core.floor_stage` at the forecast rate."""

from __future__ import annotations

from perf_model.api import PerfPredictor
from planner.core.config import RoleConfig
from planner.core.decision import Mode, Reason
from planner.core.observation import RoleLoad, Traffic
from planner.core.observed_batch import OutputDemand
from planner.core.recommend import recommend_sla
from planner.core.recommendation import Recommendation
from planner.core.reconcile import Reconciled
from planner.core.threshold import recommend_threshold
from planner.discovery import Role

__all__ = ["recommend_role"]


def recommend_role(
    role: Role,
    rc: RoleConfig,
    current: int,
    recon: Reconciled,
    load: RoleLoad,
    traffic: Traffic | None,
    predictor: PerfPredictor | None,
    corrections: tuple[float, float] = (0.0, 0.0),
    startup_s: float = 0.0,
    tail_may_raise: bool = True,
    prompt_cv2: float = 0.0,
    demand: OutputDemand | None = None,
    ready: int | None = None,
) -> tuple[Recommendation, tuple[Reason, ...]]:
    extra: tuple[Reason, ...] = ()
    if rc.mode != Mode.THRESHOLD and predictor is not None and predictor.ready:
        search_max = max(rc.max_replicas, current, 1) * 4
        return recommend_sla(
            role,
            current,
            recon,
            load,
            traffic,
            predictor,
            rc.sla,
            rc.headroom_frac,
            search_max,
            itl_headroom_frac=rc.itl_headroom_frac,
            default_max_num_batched_tokens=rc.default_max_num_batched_tokens,
            ttft_correction_frac=corrections[0],
            itl_correction_frac=corrections[1],
            startup_s=startup_s,
            attainment_goal=rc.sla_feedback.attainment_goal,
            min_samples=rc.sla_feedback.min_samples,
            tail_may_raise=tail_may_raise,
            prompt_cv2=prompt_cv2 if role is Role.PREFILL else 0.0,
            demand=demand,
            ready=ready,
        ), extra
    if rc.mode == Mode.SLA or (rc.mode == Mode.AUTO and predictor is not None):
        extra = (Reason.PERF_MODEL_NOT_READY,)
    return recommend_threshold(role, current, recon, load, rc.threshold), extra
