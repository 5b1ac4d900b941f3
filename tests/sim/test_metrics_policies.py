"""Metrics (flaps, attainment) and the baseline policies' rules."""

from __future__ import annotations

import numpy as np
import pytest

from planner.discovery import Role
from planner.sim.engine import EngineConfig, SimRequest
from planner.sim.fleet import FleetConfig, ScaleEvent, SimFleet
from planner.sim.metrics import Outcomes, SlaConfig, count_flaps, summarize
from planner.sim.policies import DynamoRulesPolicy, HpaQueuePolicy, TickTraffic
from planner.sim.timing import ProfileFitTimer

TIMER = ProfileFitTimer(base_s=0.010, a_p=0.0001, a_attn=0.0, a_d=0.001, a_kv=0.0)
NO_TRAFFIC = TickTraffic(request_rate_per_s=0.0, isl_tokens=None, osl_tokens=None)


def ev(at: float, a: int, b: int) -> ScaleEvent:
    return ScaleEvent(at_s=at, role=Role.AGG, from_replicas=a, to_replicas=b)


@pytest.mark.parametrize(
    ("events", "flaps"),
    [
        pytest.param([ev(0, 1, 2), ev(10, 2, 3)], 0, id="two ups are no flap"),
        pytest.param([ev(0, 1, 2), ev(100, 2, 1)], 1, id="down 100 s after up is a flap"),
        pytest.param([ev(0, 1, 2), ev(301, 2, 1)], 0, id="reversal after 5 minutes is not"),
        pytest.param([ev(0, 2, 1), ev(60, 1, 2), ev(120, 2, 1)], 2, id="down up down is two"),
    ],
)
def test_flaps_are_direction_reversals_within_five_minutes(events: list[ScaleEvent], flaps: int) -> None:
    assert count_flaps(events) == flaps


def test_attainment_needs_both_targets_and_skips_infeasible_requests() -> None:
    out = Outcomes(4, np.array([True, True, True, False]))
    out.ttft_s[:] = [0.5, 3.0, 0.5, 9.0]
    out.itl_s[:] = [0.01, 0.01, 0.09, 0.01]
    out.finish_s[:] = 1.0
    s = summarize(
        out,
        SlaConfig(ttft_ms=2000, itl_ms=50),
        gpu_hours=2.0,
        events=[],
        timeline=[],
        replay_wall_s=0.0,
        oracle_gpu_hours=1.0,
    )
    assert s.sla_attainment == pytest.approx(1 / 3)
    assert s.feasible_requests == 3
    assert s.gpu_hours_vs_oracle == 2.0


def agg_fleet(n: int) -> SimFleet:
    f = SimFleet(FleetConfig(engine=EngineConfig(max_num_batched_tokens=100, prefix_cache=False)), TIMER)
    f.scale(Role.AGG, n, 0.0, instant=True)
    return f


def test_hpa_scale_up_is_limited_to_max_of_double_and_plus_four() -> None:
    f = agg_fleet(2)
    for i in range(200):
        f.submit(SimRequest(i, 0.0, 1000, 1), 0.0)  # deep queues on both replicas
    HpaQueuePolicy(target_queue_per_replica=1.0).tick(f, 0.0, NO_TRAFFIC)
    assert f.desired(Role.AGG) == 6  # max(2 x 2, 2 + 4)


def test_hpa_scale_down_waits_for_the_stabilization_window() -> None:
    f = agg_fleet(4)
    hpa = HpaQueuePolicy(target_queue_per_replica=1.0)
    for i in range(8):
        f.submit(SimRequest(i, 0.0, 1000, 1), 0.0)
    hpa.tick(f, 0.0, NO_TRAFFIC)  # recommends 4 (1 waiting / replica): hold
    f.run_until(100.0)
    hpa.tick(f, 100.0, NO_TRAFFIC)  # queue empty: recommends 1, but 4 was recommended < 300 s ago
    assert f.desired(Role.AGG) == 4
    hpa.tick(f, 301.0, NO_TRAFFIC)
    assert f.desired(Role.AGG) == 1


def test_dynamo_rules_add_one_only_when_every_engine_misses() -> None:
    sla = SlaConfig(ttft_ms=500, itl_ms=50)
    f = agg_fleet(2)
    for i in range(50):
        f.submit(SimRequest(i, 0.0, 1000, 1), 0.0)  # all on... the router spreads them over both
    DynamoRulesPolicy(TIMER, sla).tick(f, 0.0, NO_TRAFFIC)
    assert f.desired(Role.AGG) == 3  # +1, not a jump
    g = agg_fleet(2)
    g.replicas[Role.AGG][0].engine.add(SimRequest(0, 0.0, 100_000, 1))  # only one engine overloaded
    DynamoRulesPolicy(TIMER, sla).tick(g, 0.0, NO_TRAFFIC)
    assert g.desired(Role.AGG) == 2


def test_dynamo_rules_remove_one_after_the_consolidation_check() -> None:
    f = agg_fleet(3)
    DynamoRulesPolicy(TIMER, SlaConfig()).tick(f, 0.0, NO_TRAFFIC)
    assert f.desired(Role.AGG) == 2
