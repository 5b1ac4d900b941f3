"""The forecast floor within the model's capacity (planner.core.floor_stage.floor_within_model): the count the model
asks at the forecast rate is asked with everything the load's own recommendation used -- the prompts' spread
among it -- and a forecast rate no count can serve leaves the derived floor standing. Written for the mutants of
floor_stage.py that survived the suite (docs/mutation-results.md).

The analytic predictor of tests/core/analytic_perf.py with the H200 engine's 2048-token chunk: 50.96 ms a chunk,
40,188 prompt tokens/s per engine; a prefill of T tokens ``1.1 x (ceil(T / 2048) x 10 + 0.02 T)`` ms."""

from __future__ import annotations

from planner.core import Mode, Reason, RoleLoad, SlaTargets, Traffic
from planner.core.floor_stage import FloorInputs, floor_within_model
from planner.core.recommendation import Recommendation
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import hpa_role, reconciled


def inputs(prompt_cv2: float) -> FloorInputs:
    """A prefill role of 2 replicas the load keeps at 2 (sla_met), 30 prompts/s of 2000 tokens, a 150 ms TTFT."""
    return FloorInputs(
        role=Role.PREFILL,
        rc=hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=150.0, itl_ms=50.0)),
        current=2,
        recon=reconciled(Role.PREFILL, 2, prefill_requests=0.0),
        load=RoleLoad(),
        traffic=Traffic(request_rate_per_s=30.0, isl_tokens=2000.0, osl_tokens=100.0),
        predictor=AnalyticPerf(),
        rec=Recommendation(replicas=2, reason=Reason.SLA_MET, mode=Mode.SLA),
        held=False,
        corrections=(0.0, 0.0),
        startup_s=0.0,  # no start-up: the count is judged against the arrivals alone
        settled=True,
        prompt_cv2=prompt_cv2,
    )


def test_the_floor_within_the_model_keeps_the_prompts_spread() -> None:
    # At a forecast of 60 prompts/s (120,000 tokens/s): 4 engines at utilization 0.746 queue 1.10 prompts (2194
    # tokens) ahead of a prompt: 4194 tokens, 3 chunks, 125 ms. A spread of CV^2 1.42 waits 2.42 times as long:
    # 7310 tokens, 4 chunks, 205 ms, past 150; 5 engines (utilization 0.597, 0.44 prompts: 2140 tokens
    # with the spread) give 124 ms.
    assert floor_within_model(inputs(0.0), 2, 60.0) == 4
    assert floor_within_model(inputs(1.42), 2, 60.0) == 5


def test_a_forecast_rate_no_count_can_serve_leaves_the_derived_floor() -> None:
    # 10M prompts/s of 2000 tokens need 500,000 engines, past the search's 100,000: the model's answer at that rate
    # is a hold (sla_unreachable), not a count to cap the floor at.
    assert floor_within_model(inputs(0.0), 2, 10_000_000.0) is None
