"""Replay billing: every policy is billed over the same span — from the first arrival to the later of the last
request's finish and the trace's end — whatever its tick (issue 13, item 8)."""

from __future__ import annotations

import math

import numpy as np

from planner.discovery import Role
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig
from planner.sim.metrics import SlaConfig
from planner.sim.policies import FixedPolicy, HpaQueuePolicy
from planner.sim.replay import feasible_mask, run_oracle, run_policy
from planner.sim.timing import ProfileFitTimer
from planner.sim.traces import synthetic_trace


def _setup(disaggregated: bool = False) -> tuple[ProfileFitTimer, FleetConfig, SlaConfig]:
    timer = ProfileFitTimer.from_dir()
    fleet = FleetConfig(engine=EngineConfig(ttft_overhead_s=timer.ttft_overhead_s), disaggregated=disaggregated)
    return timer, fleet, SlaConfig()


def test_policies_holding_the_same_fleet_bill_the_same_gpu_hours_whatever_their_tick() -> None:
    timer, fleet_cfg, sla = _setup()
    trace = synthetic_trace(rate_per_s=[(40.0, 4.0), (20.0, 12.0)], isl=1500, osl=300, seed=11)
    feasible = feasible_mask(trace, timer, fleet_cfg, sla)
    policies = [
        FixedPolicy(3, name="fixed-5s", tick_s=5.0),
        FixedPolicy(3, name="fixed-60s", tick_s=60.0),
        FixedPolicy(3, name="fixed-7s", tick_s=7.0),
        HpaQueuePolicy(min_replicas=3, max_replicas=3),  # a 15 s tick, clamped to the same fleet
    ]
    runs = [
        run_policy(trace, p, fleet_config=fleet_cfg, timer=timer, sla=sla, feasible=feasible, initial_replicas=3)
        for p in policies
    ]
    first = runs[0]
    finish = first.outcomes.finish_s
    assert np.isfinite(finish).all()
    end = max(float(finish.max()), trace.duration_s)
    expected = 3 * (end - float(trace.arrival_s[0])) / 3600.0
    for run in runs:
        assert run.events == []  # nobody scaled: the same fleet throughout
        np.testing.assert_array_equal(run.outcomes.finish_s, finish)  # and the same service
        assert math.isclose(run.gpu_hours, expected, rel_tol=1e-12), (run.name, run.gpu_hours, expected)


def test_disaggregated_fleets_bill_both_roles_over_the_same_span() -> None:
    timer, fleet_cfg, sla = _setup(disaggregated=True)
    trace = synthetic_trace(rate_per_s=[(30.0, 5.0)], isl=800, osl=100, seed=12)
    feasible = feasible_mask(trace, timer, fleet_cfg, sla)
    runs = [
        run_policy(
            trace,
            FixedPolicy(2, tick_s=t),
            fleet_config=fleet_cfg,
            timer=timer,
            sla=sla,
            feasible=feasible,
            initial_replicas=2,
        )
        for t in (5.0, 45.0)
    ]
    end = max(float(runs[0].outcomes.finish_s.max()), trace.duration_s)
    expected = 2 * len((Role.PREFILL, Role.DECODE)) * (end - float(trace.arrival_s[0])) / 3600.0
    for run in runs:
        assert math.isclose(run.gpu_hours, expected, rel_tol=1e-12)


def test_the_oracle_is_billed_over_the_same_span() -> None:
    timer, fleet_cfg, sla = _setup()
    trace = synthetic_trace(rate_per_s=[(90.0, 3.0)], isl=1000, osl=400, seed=13)
    feasible = feasible_mask(trace, timer, fleet_cfg, sla)
    oracle, outcomes = run_oracle(trace, fleet_config=fleet_cfg, timer=timer, sla=sla, feasible=feasible)
    assert set(oracle.replicas) == {1}  # one replica is enough in every window
    end = max(float(np.nanmax(outcomes.finish_s)), trace.duration_s)
    assert math.isclose(oracle.gpu_hours, (end - float(trace.arrival_s[0])) / 3600.0, rel_tol=1e-12)
