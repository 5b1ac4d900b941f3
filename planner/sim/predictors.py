"""Perf models for "ours": perf_model's :class:`~perf_model.model.PerfModel` per role, bootstrapped from the
measured profile (the same profile the simulated engines are timed with). The replay does not feed it live
samples, where the service does (planner.service.perf_feed: the live fit replaces the bootstrap once ready): on the
engines' own profile the bootstrap's central prediction is exact and its band the fixed 10 % of
``bootstrap_band_frac``. Fed live (measured on burst_train seed 1 agg restore, 2026-12-02) the fit's band settles
at 1.06 and "ours" ran 99.09 % / 2.06 GPU-h against 99.68 % / 2.06 bootstrapped: the fit's own error costs
attainment and its narrower band saved nothing there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from perf_model.api import PerfPredictor
from planner.discovery import Role
from planner.errors import ConfigError

if TYPE_CHECKING:
    from planner.sim.compare import CompareSettings

__all__ = ["profile_predictors"]


def profile_predictors(profile_dir: str | Path, settings: CompareSettings) -> Mapping[Role, PerfPredictor] | None:
    """One bootstrapped :class:`~perf_model.model.PerfModel` per role of the fleet; None when perf_model's
    model is not available in this build."""
    try:
        from perf_model.model import PerfModel
        from perf_model.step_timer import ProfileStepTimer
    except ImportError:
        return None
    try:
        timer = ProfileStepTimer.from_dir(profile_dir)
    except Exception as exc:
        raise ConfigError(f"cannot bootstrap the perf model from {profile_dir}: {exc}") from exc
    return {role: PerfModel(role, bootstrap=timer) for role in settings.fleet.roles}
