"""Rows for planner/core/safety.py's survivors (docs/testing.md, mutation testing): the in-flight hold's raise for
the arrivals (only above the count in flight, only past the rate-growth raise, from a scale-up from zero, and the
detail an operator reads), ``target_not_reached`` only while fewer are ready than desired, the coverage gap's
count of usable discovered workers, and an incomplete coverage breaking the run by default. Each fails on the
mutant it was written for."""

from __future__ import annotations

from planner.core import Coverage, DeploymentStatus, Reason
from planner.core.safety import describe_gaps, hold_in_flight, next_coverage_since
from planner.discovery import Role

NOW = 100.0
SCALING_UP = DeploymentStatus(service="decode", desired=5, ready=3)  # 2 of a scale-up 3 -> 5 still coming


def test_the_arrivals_raise_the_target_in_flight_and_say_so() -> None:
    held, _ = hold_in_flight(8, 5, SCALING_UP, NOW - 10.0, NOW, 600.0, raise_to=None, arrivals_raise_to=7)
    assert (held.replicas, held.reason) == (7, Reason.IN_FLIGHT_RAISED_FOR_ARRIVALS)
    assert held.detail == "3 of 5 ready, but the arrivals alone need 7: target raised to 7"


def test_no_raise_for_the_arrivals_when_the_load_asks_the_count_in_flight() -> None:
    held, _ = hold_in_flight(5, 5, SCALING_UP, NOW - 10.0, NOW, 600.0, raise_to=None, arrivals_raise_to=7)
    assert (held.replicas, held.reason) == (5, None)  # nothing to hold: the count in flight stands


def test_arrivals_that_need_no_more_than_the_rate_growth_leave_it_the_rate_growths_raise() -> None:
    held, _ = hold_in_flight(8, 5, SCALING_UP, NOW - 10.0, NOW, 600.0, raise_to=7, arrivals_raise_to=7)
    assert (held.replicas, held.reason) == (7, Reason.IN_FLIGHT_TARGET_RAISED)


def test_a_scale_up_from_zero_in_flight_is_raised_for_one_replicas_arrivals() -> None:
    from_zero = DeploymentStatus(service="decode", desired=0, ready=0, action_in_flight=True)
    held, _ = hold_in_flight(2, 0, from_zero, NOW - 10.0, NOW, 600.0, raise_to=None, arrivals_raise_to=1)
    assert (held.replicas, held.reason) == (1, Reason.IN_FLIGHT_RAISED_FOR_ARRIVALS)


def test_a_target_reached_is_not_reported_unreached_however_long_the_action_takes() -> None:
    settling = DeploymentStatus(service="decode", desired=5, ready=5, action_in_flight=True)
    _, extra = hold_in_flight(5, 5, settling, NOW - 900.0, NOW, 600.0)
    assert extra == ()
    _, late = hold_in_flight(5, 5, SCALING_UP, NOW - 900.0, NOW, 600.0)
    assert late == (Reason.TARGET_NOT_REACHED,)


def coverage(**kw: object) -> Coverage:
    base: dict[str, object] = dict(
        role=Role.DECODE,
        service="decode",
        discovered=3,
        healthy=2,
        partial=0,
        silent=0,
        identity_not_synced=0,
        not_ready=1,
        ranks_expected=3,
        ranks_fresh=2,
        deployment_desired=4,
        deployment_ready=4,
        complete=False,
        gaps=(Reason.READY_REPLICAS_UNDISCOVERED,),
    )
    return Coverage(**{**base, **kw})  # type: ignore[arg-type]


def test_the_undiscovered_gap_counts_the_discovered_workers_that_are_ready() -> None:
    """3 discovered, 1 of them not ready: discovery knows 2 of the 4 the deployment reports ready."""
    assert describe_gaps(coverage()) == (
        "ready_replicas_undiscovered: the deployment reports 4 ready, discovery knows 2"
    )


def test_an_incomplete_coverage_breaks_the_run_unless_only_newcomers_are_missing() -> None:
    assert next_coverage_since(coverage(), 50.0, NOW) is None
    assert next_coverage_since(coverage(), 50.0, NOW, newcomers_only=True) == 50.0
    assert next_coverage_since(coverage(complete=True, gaps=()), None, NOW) == NOW
