"""Rows for planner/core/floor_stage.py's ``model_count_at_level`` after 787fb07 (docs/testing.md, mutation
testing): the model's count at a forecast rate sees how many of the desired replicas are ready, as the load's own
call does. A queue held by few ready replicas grows on them past a start-up, and the floor asks for the arrivals on
top of them; counting every desired replica as draining would call it drained and keep the count.

The prefill service of tests/core/test_core_backlog_ready.py (the analytic predictor, 2048-token chunks: one engine
prefills 40,188 tokens/s): 6 desired, 1M prompt tokens queued, 2000-token prompts, a 60 s start-up."""

from __future__ import annotations

import msgspec

from planner.core import Mode, Reason, RoleConfig, RoleLoad, Traffic
from planner.core.floor_stage import FloorInputs, floor_within_model, model_count_at_level
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import reconciled
from tests.core.test_core_backlog_ready import QUEUED, SLA, six_desired

SEEN = Traffic(request_rate_per_s=20.0, isl_tokens=2000.0, osl_tokens=100.0)


def six_with(ready: int | None) -> FloorInputs:
    """The floor's inputs for 6 prefill replicas desired, ``ready`` of them up, seen at 20 req/s (40,000 tokens/s:
    the 2 ready drain the queue in 25 s, before a start-up, so the load's own answer holds 6)."""
    rec = six_desired(ready, 20.0)
    assert (rec.replicas, rec.reason) == (6, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    return FloorInputs(
        role=Role.PREFILL,
        rc=RoleConfig(mode=Mode.SLA, sla=SLA, max_replicas=16, headroom_frac=0.0, startup_s=60.0),
        current=6,
        recon=reconciled(Role.PREFILL, 6, prefill_requests=QUEUED / 2000.0),
        load=RoleLoad(queued_prefill_tokens=QUEUED),
        traffic=SEEN,
        predictor=AnalyticPerf(),
        rec=rec,
        held=False,
        corrections=(0.0, 0.0),
        startup_s=60.0,
        settled=True,
        prompt_cv2=0.0,
        ready=ready,
    )


def test_the_forecast_floor_counts_the_queue_on_the_ready_replicas_only() -> None:
    # At a forecast of 80 req/s (160,000 tokens/s) the 2 ready replicas' 80,376 tokens/s fall behind: the queue
    # outlasts a start-up on them, and the arrivals alone need 5, so 7. The 6 desired, all counted as draining,
    # would clear it in 1e6 / (241,128 - 160,000) = 12 s and keep 6.
    two_ready = six_with(2)
    assert model_count_at_level(two_ready, 80.0) == 7
    assert floor_within_model(two_ready, 6, 80.0) == 7
    every_one_up = msgspec.structs.replace(two_ready, ready=None)
    assert model_count_at_level(every_one_up, 80.0) == 6
