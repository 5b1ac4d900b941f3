"""Safety rows the mutation run showed missing: the sentence naming the workers behind each coverage gap (from a
real reconcile), and raising an in-flight target only above the current count."""

from __future__ import annotations

import pytest

from planner.core import DeploymentStatus, Reason
from planner.core.reconcile import reconcile
from planner.core.safety import describe_gaps, hold_in_flight
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load

NOW = 100.0


def test_describe_gaps_names_every_worker_behind_every_gap() -> None:
    fleet = Fleet()
    fleet.add("decode-0", Role.DECODE, dp=4)  # partial
    for i in range(1, 11):
        fleet.add(f"decode-{i:02d}", Role.DECODE)  # ten silent
    fleet.add("decode-x", Role.DECODE, dp=2)  # unsynced under two ids
    fleet.deploy("decode", desired=20, ready=15)
    fleet.publish("decode-0", NOW - 1, Load(decode=1), ranks=(0, 2))
    fleet.publish("decode-x", NOW - 1, Load(decode=1), ranks=(0,), as_id="")
    fleet.publish("decode-x", NOW - 1, Load(decode=1), ranks=(1,), as_id="other")
    coverage = reconcile(
        Role.DECODE, "decode", list(fleet.workers.values()), fleet.store.snapshot(NOW), fleet.deployments["decode"]
    ).coverage
    assert describe_gaps(coverage) == (
        "identity_not_synced: decode-x publish under '', 'other' instead of their registered ids; "
        "ranks_missing: decode-0 (ranks 1, 3); "
        "workers_silent: decode-01, decode-02, decode-03, decode-04, decode-05, decode-06, decode-07, decode-08"
        " and 2 more; "
        "ready_replicas_undiscovered: the deployment reports 15 ready, discovery knows 12"
    )


@pytest.mark.parametrize(
    ("raise_to", "replicas", "reason"),
    [
        (None, 4, Reason.ACTION_IN_FLIGHT),
        (4, 4, Reason.ACTION_IN_FLIGHT),  # raising "to" the current count is no raise
        (5, 5, Reason.IN_FLIGHT_TARGET_RAISED),
        (9, 7, Reason.IN_FLIGHT_TARGET_RAISED),  # never past what was asked
    ],
)
def test_an_in_flight_target_is_raised_only_above_the_current_count(
    raise_to: int | None, replicas: int, reason: Reason
) -> None:
    deployment = DeploymentStatus(service="decode", desired=4, ready=2)
    out, extra = hold_in_flight(7, 4, deployment, NOW - 10, NOW, 300.0, raise_to=raise_to)
    assert (out.replicas, out.reason, extra) == (replicas, reason, ())
