"""Property (issue 12): whatever the observation — non-finite or absurd values in the load, the override or the
traffic, FPM counts up to 2^64 - 1, a missing deployment status, silent workers, actuator bounds — one step of the
core returns, keeps every count within the effective bounds, and never goes below the deployment's count while its
status is missing or its data is blind. The only exception it may raise is ObservationError, on malformed input."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import (
    CoreConfig,
    CoreState,
    DeploymentStatus,
    Mode,
    Observation,
    ObservationError,
    RoleBounds,
    RoleConfig,
    RoleLoad,
    Traffic,
    step,
)
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, Fleet, Load
from tests.core.test_core_properties import floats
from tests.hypothesis_profiles import examples, scaled_timeout_s

TIMER = ProfileStepTimer.from_dir(H200_PROFILE)

wild = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 2.0**64 - 1, 1e300, 5e-324]),
    st.floats(0, 1e6),
)
count = st.one_of(st.integers(0, 5000), st.sampled_from([2**64 - 1, 2**53, 2**32]))
fpm_load = st.builds(Load, queued_prefill=count, prefill=count, decode=count, kv=count, queued_decode=count)
role_load = st.builds(
    RoleLoad,
    queued_prefill_tokens=wild,
    scheduled_prefill_tokens=wild,
    decode_requests=wild,
    queued_decode_requests=wild,
    decode_kv_tokens=wild,
)
traffic = st.builds(Traffic, request_rate_per_s=wild, isl_tokens=wild, osl_tokens=wild, isl_tokens_p99=wild)
tick = st.fixed_dictionaries(
    {
        "loads": st.lists(st.one_of(st.none(), fpm_load), min_size=4, max_size=4),  # None: silent worker
        "status": st.one_of(st.none(), st.tuples(st.integers(0, 10), st.integers(0, 10), st.booleans())),
        "override": st.one_of(st.none(), role_load),
        "traffic": st.one_of(st.none(), traffic),
        "gap_s": st.sampled_from([1.0, 5.0, 60.0]),
    }
)


@settings(max_examples=examples(80), deadline=None)
@given(
    ticks=st.lists(tick, min_size=1, max_size=8),
    role=st.sampled_from(list(Role)),
    mode=st.sampled_from([Mode.SLA, Mode.THRESHOLD]),
    bounds=st.tuples(st.integers(0, 3), st.integers(3, 12)),
    actuator_max=st.one_of(st.none(), st.integers(3, 12)),
    workers=st.integers(0, 4),
)
@pytest.mark.timeout(scaled_timeout_s(300, 80))
def test_the_core_answers_within_bounds_and_never_lowers_a_blind_fleet(
    ticks: list[dict[str, object]],
    role: Role,
    mode: Mode,
    bounds: tuple[int, int],
    actuator_max: int | None,
    workers: int,
) -> None:
    fleet = Fleet()
    fleet.add_many(workers, role)
    rc = RoleConfig(mode=mode, min_replicas=bounds[0], max_replicas=bounds[1], service=role.value)
    config = CoreConfig(roles={role: rc})
    if actuator_max is not None:
        config = config.with_actuator_bounds({role: RoleBounds(min_replicas=0, max_replicas=actuator_max)})
    effective = config.role(role).effective_bounds
    predictors = {role: PerfModel(role, bootstrap=TIMER)}
    state = CoreState()
    now = 0.0
    for spec in ticks:
        for wid, load in zip(list(fleet.workers), spec["loads"], strict=False):  # type: ignore[call-overload]
            if load is not None:
                fleet.publish(wid, now, load)
        status = spec["status"]
        deployments: dict[str, DeploymentStatus] = {}
        if status is not None:
            desired, ready, in_flight = status  # type: ignore[misc]
            deployments[role.value] = DeploymentStatus(
                service=role.value, desired=desired, ready=min(ready, desired), action_in_flight=in_flight
            )
        override = spec["override"]
        observation = Observation(
            workers=dict(fleet.workers),
            fleet=fleet.store.snapshot(now),
            deployments=deployments,
            traffic={role: spec["traffic"]} if spec["traffic"] is not None else {},  # type: ignore[dict-item]
            load_override={role: override} if override is not None else {},  # type: ignore[dict-item]
        )
        state, decisions = step(state, observation, now, config, predictors=predictors)
        (d,) = decisions
        assert effective.min_replicas <= d.final_replicas <= effective.max_replicas
        blind = status is None or not d.coverage.complete
        if blind:
            assert d.final_replicas >= min(d.current_replicas, effective.max_replicas)
        values = floats(msgspec.to_builtins(d))
        assert values and all(math.isfinite(f) for f in values)
        assert d.reasons[-1].value == d.action.value
        now += float(spec["gap_s"])  # type: ignore[arg-type]


@pytest.mark.parametrize(("desired", "ready"), [(-1, 0), (3, -2)])
def test_a_negative_deployment_count_is_an_observation_error(desired: int, ready: int) -> None:
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    observation = Observation(
        workers=dict(fleet.workers),
        fleet=fleet.store.snapshot(0.0),
        deployments={"decode": DeploymentStatus(service="decode", desired=desired, ready=ready)},
    )
    with pytest.raises(ObservationError, match="must be an integer >= 0"):
        step(CoreState(), observation, 0.0, CoreConfig())
