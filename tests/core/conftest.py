"""Fixtures the decision core's tests share."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE


@pytest.fixture(scope="module")
def prefill_model() -> PerfModel:
    """A prefill perf model bootstrapped from the measured H200 profile, one per test module."""
    return PerfModel(Role.PREFILL, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
