"""Property: whatever the fleet does — silent, partial, unsynced, stray, in flight, any load — the safety
invariants hold on every tick."""

from __future__ import annotations

import math

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core import Action, CoreConfig, CoreState, Decision, RoleConfig, step
from planner.core.config import hpa_scale_down
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load
from tests.hypothesis_profiles import examples

worker_behaviour = st.sampled_from(["ok", "ok", "ok", "silent", "partial", "unsynced"])
tick = st.fixed_dictionaries(
    {
        "load": st.builds(
            Load,
            queued_prefill=st.integers(0, 50_000),
            prefill=st.integers(0, 20_000),
            decode=st.integers(0, 3_000),
            kv=st.integers(0, 400_000),
            queued_decode=st.integers(0, 40),
        ),
        "behaviour": st.lists(worker_behaviour, min_size=6, max_size=6),
        "ready_short": st.integers(0, 2),
        "in_flight": st.booleans(),
        "stray": st.booleans(),
        "gap_s": st.sampled_from([5.0, 5.0, 5.0, 30.0, 120.0]),
    }
)


def floats(value: object) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in floats(v)]
    if isinstance(value, list | tuple):
        return [f for v in value for f in floats(v)]
    return []


@settings(max_examples=examples(60), deadline=None)
@given(
    ticks=st.lists(tick, min_size=1, max_size=25),
    role=st.sampled_from(list(Role)),
    min_replicas=st.integers(0, 3),
    dp=st.sampled_from([1, 2]),
)
def test_safety_invariants_hold_on_every_tick(
    ticks: list[dict[str, object]], role: Role, min_replicas: int, dp: int
) -> None:
    fleet = Fleet()
    fleet.add_many(6, role, dp=dp)
    fleet.deploy(role.value, 6)
    # The HPA scale-down window (300 s), pinned: the shipped default's window is two start-ups, measured from the
    # deployment's desired -> ready transitions (planner.core.startup), so it has no fixed first edge to check.
    rc = RoleConfig(
        min_replicas=min_replicas, max_replicas=12, scale_down=hpa_scale_down(), scale_down_window_startups=None
    )
    config = CoreConfig(roles={role: rc}, max_total_gpus=10)
    state = CoreState()
    now = 0.0
    for spec in ticks:
        load: Load = spec["load"]  # type: ignore[assignment]
        behaviour: list[str] = spec["behaviour"]  # type: ignore[assignment]
        workers = list(fleet.workers)
        for wid, how, part in zip(workers, behaviour, load.split(len(workers)), strict=False):
            if how == "ok":
                fleet.publish(wid, now, part)
            elif how == "partial" and dp > 1:
                fleet.publish(wid, now, part, ranks=(0,))
            elif how == "unsynced":
                fleet.publish(wid, now, part, as_id="")
        if spec["stray"]:
            fleet.stray("tcp://10.99.0.1:20380", "stranger", now)
        current = fleet.deployments[role.value].desired
        ready = max(current - int(spec["ready_short"]), 0)  # type: ignore[call-overload]
        fleet.deploy(role.value, current, ready, in_flight=bool(spec["in_flight"]))
        in_flight = fleet.deployments[role.value].in_flight
        coverage_problem = any(how != "ok" for how in behaviour[: len(workers)])
        state, decisions = step(state, fleet.observe(now), now, config)
        (d,) = decisions
        check(d, in_flight, coverage_problem and ready > 0, now)
        if d.action != Action.HOLD:
            fleet.deploy(role.value, d.final_replicas)
        now += float(spec["gap_s"])  # type: ignore[arg-type]


def check(d: Decision, in_flight: bool, coverage_problem: bool, now: float) -> None:
    values = floats(msgspec.to_builtins(d))
    assert values and all(math.isfinite(f) for f in values)
    if d.action == Action.SCALE_DOWN:
        assert d.coverage.complete
        assert now >= 300.0  # never inside the first scale-down window
        assert not (coverage_problem and d.coverage.healthy < (d.coverage.deployment_ready or 0))
    if in_flight:
        assert d.action != Action.SCALE_UP
    if d.action == Action.SCALE_UP:
        assert d.final_replicas <= 10  # GPU budget of 10, one GPU per replica
    assert d.final_replicas >= 0
    assert d.reasons[-1].value == d.action.value
