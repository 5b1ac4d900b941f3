"""One tick of the decision core: ``step(state, observation, now, config) -> (state, decisions)``.

Pure: ``now`` is an argument, no clock, no I/O, no threads. The pipeline per service:
reconcile -> recommend (SLA or threshold) -> forecast floor -> bounds -> rate limit -> stabilize -> safety
-> in flight -> GPU budget (across services). See docs/decision_core.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from perf_model.api import PerfPredictor
from planner.core.config import CoreConfig
from planner.core.decision import Decision
from planner.core.observation import Observation
from planner.core.state import CoreState
from planner.discovery import Role

__all__ = ["step"]


def step(
    state: CoreState,
    observation: Observation,
    now: float,
    config: CoreConfig,
    *,
    predictors: Mapping[Role, PerfPredictor] | None = None,
) -> tuple[CoreState, tuple[Decision, ...]]:
    """Decide every service's replica count at ``now``.

    Returns the new state (pass it to the next call) and one :class:`Decision` per service, holds included,
    sorted by role then service. ``predictors`` (per role) enables SLA mode for roles whose config mode is
    ``sla`` or ``auto``; a predictor that is not ``ready`` falls back to threshold mode with the reason
    ``perf_model_not_ready``. To answer "what if" without acting, call ``step`` and discard the returned
    state.
    """
    raise NotImplementedError("decision pipeline lands in the next commit")
