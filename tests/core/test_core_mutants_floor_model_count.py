"""Rows for planner/core/floor_stage.py's ``model_count_at_level`` (docs/testing.md, mutation testing), the model's
count at a rate that the steady floor (Holt's level, any role) and the floor within the model (the forecast rate,
prefill and decode roles) both ask: on aggregated engines the ITL tail may add replicas there only once the
capacity has settled, as in the load's own call (the misses observed predate what is still coming).

The aggregated service of tests/core/test_core_mutants_recommend_role.py: the measured H200 profile's step model,
short outputs behind 12k-token prompts, 2 % of 500 requests missing their ITL on 8 replicas."""

from __future__ import annotations

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import Mode, RoleLoad, SlaTargets
from planner.core.floor_stage import FloorInputs, model_count_at_level
from planner.core.recommend_role import recommend_role
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, hpa_role, reconciled
from tests.core.test_core_mutants_recommend_role import TAIL
from tests.core.test_core_observed_batch_rate import floor_inputs

SEEN = msgspec.structs.replace(TAIL, requests_in_window=500)  # the window's count: its attainment goes with its rate


@pytest.fixture(scope="module")
def inputs() -> FloorInputs:
    model = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    rc = hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=2000, itl_ms=50))
    recon = reconciled(Role.AGG, 8, prefill_requests=32.0)
    rec, _ = recommend_role(Role.AGG, rc, 8, recon, RoleLoad(), SEEN, model)
    assert rec.mode == Mode.SLA
    # this aggregated service in test_core_observed_batch_rate's decode inputs (no correction, no start-up, not
    # held, settled)
    decode = floor_inputs(PerfModel(Role.DECODE, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE)))
    return msgspec.structs.replace(
        decode, role=Role.AGG, rc=rc, current=8, recon=recon, load=RoleLoad(), traffic=SEEN, predictor=model, rec=rec
    )


def test_the_itl_tail_adds_replicas_at_the_level_only_once_the_capacity_has_settled(inputs: FloorInputs) -> None:
    """At the window's own rate (12 req/s, its attainment kept): settled, the tail asks more than the 8 running;
    with capacity still coming it only keeps them."""
    level = SEEN.request_rate_per_s
    assert level is not None
    settled = model_count_at_level(inputs, level)
    coming = model_count_at_level(msgspec.structs.replace(inputs, settled=False), level)
    assert settled is not None and settled > 8
    assert coming == 8
