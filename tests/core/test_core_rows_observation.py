"""Observation rows the mutation run showed missing: a deployment status built from what an actuator reads, and
when an earlier action counts as in flight."""

from __future__ import annotations

import pytest

from planner.actuators.base import ServiceStatus
from planner.core import DeploymentStatus


def test_a_deployment_status_carries_every_count_the_actuator_read() -> None:
    read = ServiceStatus(service="decode", desired=6, ready=4, available=3, updated=5, observed_at=12.0, state="x")
    assert DeploymentStatus.from_service_status(read) == DeploymentStatus(
        service="decode", desired=6, ready=4, available=3, updated=5
    )
    flagged = DeploymentStatus.from_service_status(read, action_in_flight=True, not_ready_workers=("decode-3",))
    assert (flagged.action_in_flight, flagged.not_ready_workers) == (True, ("decode-3",))


@pytest.mark.parametrize(
    ("desired", "ready", "flagged", "in_flight"),
    [(4, 4, False, False), (4, 3, False, True), (4, 5, False, False), (4, 4, True, True)],
    ids=["settled", "fewer ready than desired", "more ready than desired (scale-down settling)", "flagged"],
)
def test_in_flight(desired: int, ready: int, flagged: bool, in_flight: bool) -> None:
    status = DeploymentStatus(service="s", desired=desired, ready=ready, action_in_flight=flagged)
    assert status.in_flight is in_flight
