"""A new count is judged on data from the count itself (planner.core.newcomers, reason ``new_replicas_held``).

A real FleetStore fed on the workers' own endpoints, ``step`` every 5 s with HPA's clamps (300 s scale-down
window, :func:`tests.core.fleetkit.hpa_role`). Four decode replicas; at 400 s the load asks for 8; the four new
replicas start (not ready) for 60 s; then the load falls to what one replica serves.
"""

from __future__ import annotations

from planner.core import Action, CoreConfig, CoreState, Coverage, Decision, Reason, WorkerCoverage, WorkerStatus
from planner.core.newcomers import newcomer_hold, only_newcomers_silent, update_reported
from planner.discovery import Role, WorkerRecord
from tests.core.fleetkit import Fleet, Load, hpa_role

TICK_S = 5.0
STARTUP_S = 60.0
LOW = Load(decode=160, kv=16_000)


def need(n: int) -> Load:
    return Load(decode=50, kv=5_000, queued_decode=n)


def run(
    *, silent_first_tick: bool, old_silent_at: float | None = None, until_s: float = 1_000.0
) -> dict[float, Decision]:
    """The decisions by time. ``silent_first_tick``: the new replicas publish from the tick after they turn
    ready (else on that very tick). ``old_silent_at``: one replica that has always reported publishes nothing
    for 15 s from then (silent once its last sample is past the store's 10 s TTL)."""
    fleet = Fleet()
    fleet.add_many(4, Role.DECODE)
    fleet.deploy("decode", 4)
    config = CoreConfig(roles={Role.DECODE: hpa_role()})
    state = CoreState()
    out: dict[float, Decision] = {}
    new_ids: tuple[str, ...] = ()
    ready_at: float | None = None
    t = 0.0
    while t <= until_s:
        if ready_at is not None and t >= ready_at and fleet.deployments["decode"].in_flight:
            fleet.deploy("decode", 8)  # the new replicas turn ready
        starting = ready_at is not None and t < ready_at
        skip = set(new_ids) if starting or (silent_first_tick and t == ready_at) else set()
        if old_silent_at is not None and old_silent_at <= t < old_silent_at + 15:  # stale after the 10 s TTL
            skip.add("decode-0")
        fleet.publish_all(t, need(4) if t < 400 else need(8) if t < 405 else LOW, skip=skip)
        state, decisions = fleet.tick(state, t, config)
        d = decisions["decode"]
        out[t] = d
        if d.action == Action.SCALE_UP:
            assert d.final_replicas == 8 and t == 400
            new_ids = tuple(r.worker_id for r in fleet.add_many(4, Role.DECODE))
            ready_at = t + STARTUP_S
            fleet.deploy("decode", 8, ready=4, not_ready=new_ids)
        elif d.action == Action.SCALE_DOWN:
            fleet.apply(d)
        t += TICK_S
    return out


def first_down(decisions: dict[float, Decision]) -> float:
    return next(t for t, d in sorted(decisions.items()) if d.action == Action.SCALE_DOWN)


def test_new_replicas_reporting_on_their_ready_tick_hold_the_count_a_window_from_that_report() -> None:
    decisions = run(silent_first_tick=False)
    assert decisions[400].action == Action.SCALE_UP
    # coverage never broke (the new replicas were not ready, then reported at once): the hold is the rule's alone
    assert [t for t, d in decisions.items() if not d.coverage.complete] == []
    held = decisions[755]
    assert held.action == Action.HOLD and Reason.NEW_REPLICAS_HELD in held.reasons
    assert Reason.SCALE_DOWN_BLOCKED in held.reasons and Reason.COVERAGE_NOT_SUSTAINED not in held.reasons
    assert "the newest replica first reported 295 s ago" in held.summary
    assert "held for 300 s" in held.summary
    # the window after the decision (400 + 300) has passed; the count waits 300 s from the first report (460)
    assert first_down(decisions) == 760


def test_a_new_replica_silent_on_its_ready_tick_does_not_restart_the_coverage_clock() -> None:
    decisions = run(silent_first_tick=True)
    silent = decisions[460]
    assert not silent.coverage.complete and silent.coverage.gaps == (Reason.WORKERS_SILENT,)
    # the scale-down still waits a window from the first report (465), under the rule's reason, not the gate's
    held = decisions[760]
    assert Reason.NEW_REPLICAS_HELD in held.reasons and Reason.COVERAGE_NOT_SUSTAINED not in held.reasons
    assert first_down(decisions) == 765


def test_a_replica_that_reported_before_and_falls_silent_restarts_the_coverage_clock() -> None:
    decisions = run(silent_first_tick=False, old_silent_at=500.0, until_s=840.0)
    assert [t for t, d in decisions.items() if not d.coverage.complete] == [510.0]
    assert decisions[510].coverage.gaps == (Reason.WORKERS_SILENT,)
    # complete again from 515: a scale-down one window later, under the gate's reason once the hold has passed
    held = decisions[810]
    assert Reason.COVERAGE_NOT_SUSTAINED in held.reasons and Reason.NEW_REPLICAS_HELD not in held.reasons
    assert first_down(decisions) == 815


def test_the_new_replicas_silent_with_an_old_one_is_a_coverage_break() -> None:
    # at the new replicas' ready tick an old replica is silent too: the clock restarts (from 465)
    decisions = run(silent_first_tick=True, old_silent_at=450.0)
    assert [t for t, d in decisions.items() if not d.coverage.complete] == [460.0]
    held = decisions[760]
    assert Reason.COVERAGE_NOT_SUSTAINED in held.reasons
    assert first_down(decisions) == 765


def coverage(silent: tuple[str, ...] = (), gaps: tuple[Reason, ...] | None = None) -> Coverage:
    problems = tuple(
        WorkerCoverage(worker_id=w, status=WorkerStatus.SILENT, missing_ranks=(0,), detail="no fresh FPM")
        for w in silent
    )
    gaps = gaps if gaps is not None else ((Reason.WORKERS_SILENT,) if silent else ())
    return Coverage(
        role=Role.DECODE,
        service="decode",
        discovered=4,
        healthy=4 - len(silent),
        partial=0,
        silent=len(silent),
        identity_not_synced=0,
        not_ready=0,
        ranks_expected=4,
        ranks_fresh=4 - len(silent),
        deployment_desired=4,
        deployment_ready=4,
        complete=not gaps,
        gaps=gaps,
        problems=problems,
    )


def workers(*ids: str) -> list[WorkerRecord]:
    fleet = Fleet()
    return [fleet.add(w, Role.DECODE) for w in ids]


def test_reported_workers_are_remembered_while_discovered_only() -> None:
    four = workers("a", "b", "c", "d")
    reported, first = update_reported(coverage(silent=("d",)), four, frozenset())
    assert reported == {"a", "b", "c"} and first
    reported, first = update_reported(coverage(silent=("d",)), four, reported)
    assert reported == {"a", "b", "c"} and not first
    reported, first = update_reported(coverage(), four, reported)
    assert reported == {"a", "b", "c", "d"} and first
    # "c" forgotten by discovery, then discovered again: a new replica under an old id
    reported, first = update_reported(coverage(), workers("a", "b", "d"), reported)
    assert reported == {"a", "b", "d"} and not first
    reported, first = update_reported(coverage(), four, reported)
    assert reported == {"a", "b", "c", "d"} and first


def test_only_newcomers_silent_needs_every_silent_worker_never_reported_and_no_other_gap() -> None:
    reported = frozenset({"a", "b"})
    assert only_newcomers_silent(coverage(silent=("c", "d")), reported)
    assert not only_newcomers_silent(coverage(silent=("b", "c")), reported)
    assert not only_newcomers_silent(coverage(), reported)  # complete: nothing to forgive
    other = (Reason.WORKERS_SILENT, Reason.READY_REPLICAS_UNDISCOVERED)
    assert not only_newcomers_silent(coverage(silent=("c",), gaps=other), reported)


def test_newcomer_hold_lasts_exactly_hold_s_from_the_first_report() -> None:
    assert newcomer_hold(None, 100.0, 60.0) == (False, "")
    held, detail = newcomer_hold(100.0, 159.0, 60.0)
    assert held and detail.startswith("the newest replica first reported 59 s ago; the count is held for 60 s")
    assert detail.endswith("of data from the count itself")
    assert newcomer_hold(100.0, 160.0, 60.0) == (False, "")
