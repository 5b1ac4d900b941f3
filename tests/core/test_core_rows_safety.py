"""Safety rows the mutation run showed missing: the sentence naming the workers behind each coverage gap (from a
real reconcile), and raising an in-flight target only above the current count."""

from __future__ import annotations

import pytest

from planner.core import Coverage, DeploymentStatus, Reason
from planner.core.reconcile import reconcile
from planner.core.safety import coverage_gate, describe_gaps, hold_in_flight
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


@pytest.mark.parametrize(("silent", "suffix"), [(8, ""), (9, " and 1 more")])
def test_at_most_eight_names_then_a_count(silent: int, suffix: str) -> None:
    fleet = Fleet()
    for i in range(silent):
        fleet.add(f"d{i}", Role.DECODE, "decode")
    fleet.deploy("decode", desired=silent)
    coverage = reconcile(
        Role.DECODE, "decode", list(fleet.workers.values()), fleet.store.snapshot(NOW), fleet.deployments["decode"]
    ).coverage
    assert describe_gaps(coverage) == "workers_silent: " + ", ".join(f"d{i}" for i in range(8)) + suffix


def complete_coverage() -> Coverage:
    fleet = Fleet()
    fleet.add("d0", Role.DECODE, "decode")
    fleet.deploy("decode", desired=1)
    fleet.publish("d0", NOW - 1, Load(decode=1))
    return reconcile(
        Role.DECODE, "decode", list(fleet.workers.values()), fleet.store.snapshot(NOW), fleet.deployments["decode"]
    ).coverage


@pytest.mark.parametrize(
    ("since", "started_at", "allowed", "reasons", "detail"),
    [
        (NOW - 60, NOW - 600, True, (), ""),  # held exactly the window
        (
            NOW - 59,
            NOW - 600,
            False,
            (Reason.COVERAGE_NOT_SUSTAINED, Reason.SCALE_DOWN_BLOCKED),
            "coverage complete for 59 s of the 60 s a scale-down needs",
        ),
        (
            None,
            NOW - 600,
            False,
            (Reason.COVERAGE_NOT_SUSTAINED, Reason.SCALE_DOWN_BLOCKED),
            "coverage complete for 0 s of the 60 s a scale-down needs",
        ),
        (
            NOW - 30,
            NOW - 30,
            False,
            (Reason.STARTUP_WINDOW, Reason.SCALE_DOWN_BLOCKED),
            "planner started 30 s ago; no scale-down in the first 60 s window",
        ),
        (
            NOW - 30,
            NOW - 60,
            False,
            (Reason.COVERAGE_NOT_SUSTAINED, Reason.SCALE_DOWN_BLOCKED),
            "coverage complete for 30 s of the 60 s a scale-down needs",
        ),  # started exactly one window ago
    ],
)
def test_the_coverage_gate(
    since: float | None, started_at: float, allowed: bool, reasons: tuple[Reason, ...], detail: str
) -> None:
    assert coverage_gate(complete_coverage(), since, started_at, NOW, 60.0) == (allowed, reasons, detail)


@pytest.mark.parametrize(
    ("value", "ready", "since", "replicas", "reason", "detail", "extra"),
    [
        (7, 2, NOW - 10, 4, Reason.ACTION_IN_FLIGHT, "2 of 4 ready; no new scale-up until it settles", ()),
        (4, 2, NOW - 10, 4, None, "", ()),
        (1, 2, NOW - 10, 2, Reason.PENDING_TARGET_LOWERED, "target 4 not reached (2 ready): lowered to 2", ()),
        (
            3,
            4,
            NOW - 10,
            4,
            Reason.ACTION_IN_FLIGHT,
            "scale-down waits until the action in flight settles (4 ready)",
            (),
        ),
        (4, 2, NOW - 300, 4, None, "", (Reason.TARGET_NOT_REACHED,)),  # pending exactly the timeout
        (4, 2, NOW - 299, 4, None, "", ()),
        (4, 2, None, 4, None, "", ()),  # no start time: nothing waited
    ],
)
def test_holding_while_in_flight(
    value: int,
    ready: int,
    since: float | None,
    replicas: int,
    reason: Reason | None,
    detail: str,
    extra: tuple[Reason, ...],
) -> None:
    flagged = ready >= 4  # 4 ready of 4 desired is in flight only when the actuator says so
    deployment = DeploymentStatus(service="decode", desired=4, ready=ready, action_in_flight=flagged)
    out, got = hold_in_flight(value, 4, deployment, since, NOW, 300.0)
    assert (out.replicas, out.reason, out.detail, got) == (replicas, reason, detail, extra)


def test_a_raised_target_says_why() -> None:
    deployment = DeploymentStatus(service="decode", desired=4, ready=2)
    out, _ = hold_in_flight(9, 4, deployment, NOW - 10, NOW, 300.0, raise_to=6)
    assert out.detail == "2 of 4 ready, but the request rate grew since the scale-up: target raised to 6"
    held, _ = hold_in_flight(4, 4, deployment, NOW - 10, NOW, 300.0, raise_to=6)
    assert (held.replicas, held.reason) == (4, None)  # no scale-up asked: nothing to raise
    settled = DeploymentStatus(service="decode", desired=4, ready=4)
    assert hold_in_flight(9, 4, settled, NOW - 10, NOW, 300.0)[0].replicas == 9
