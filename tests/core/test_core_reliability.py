"""Issue 12, the core's side: no input makes a prediction loop forever, a role with no worker prefills in a sane
chunk, NaN / inf / absurd loads hold with a reason (never recommend 0), and the actuator's bounds cap the core.

Tests that guard against a hang carry a ``timeout`` mark: on the old code the call never returns and the test
fails at the deadline; the call itself takes microseconds (a hang guard, not a speed assertion).
"""

from __future__ import annotations

import math

import pytest

from perf_model.model import PerfModel, prefill_chunks_ms
from perf_model.step_timer import ProfileStepTimer
from planner.core import (
    Action,
    CoreConfig,
    CoreConfigError,
    CoreState,
    Mode,
    Observation,
    PolicyKind,
    Reason,
    RoleBounds,
    RoleConfig,
    RoleLoad,
    ScaleRules,
    ScalingPolicy,
    Stage,
    Traffic,
    step,
)
from planner.core.recommend import predict_agg_latency
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE, Fleet, Load

HUGE = 2**64 - 1
FAST_DOWN = ScaleRules(
    stabilization_window_s=0.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),)
)


@pytest.fixture(scope="module")
def timer() -> ProfileStepTimer:
    return ProfileStepTimer.from_dir(H200_PROFILE)


def _reference_ttft_ms(model: PerfModel, isl: float, queued: float, chunk: int) -> float:
    """The chunk-by-chunk sum, written out for sizes where it ends (the closed form must equal it)."""
    step = model._require(prefill=True, decode=False)[0]
    total = 0.0
    full = math.floor(queued / chunk)
    total += full * step((float(chunk), 0.0, 0.0, 0.0))
    left = queued - full * chunk
    done = 0.0
    while done < isl:
        own = min(chunk - left, isl - done)
        total += step((left + own, done * own / (left + own), 0.0, 0.0))
        left = 0.0
        done += own
    return total


@pytest.mark.parametrize(
    ("isl", "queued", "chunk"), [(1.0, 0.0, 8192), (5000.0, 0.0, 2048), (20000.0, 5000.0, 2048), (8192.0, 8191.0, 8192)]
)
def test_closed_form_ttft_equals_the_chunk_by_chunk_sum(
    timer: ProfileStepTimer, isl: float, queued: float, chunk: int
) -> None:
    for role in (Role.PREFILL, Role.AGG):
        model = PerfModel(role, bootstrap=timer)
        expected = model.ttft_overhead_ms + _reference_ttft_ms(model, isl, queued, chunk)
        assert model.predict_ttft_ms(isl, queued, chunk).value_ms == pytest.approx(expected, rel=1e-9)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("isl", [2.0**64 - 1, 1e20, 1e9])
def test_ttft_of_an_absurd_prompt_answers(timer: ProfileStepTimer, isl: float) -> None:
    """``1e20 + 8192 == 1e20``: a per-chunk loop never ends. Closed form: a huge time, never a hang nor NaN."""
    estimate = PerfModel(Role.PREFILL, bootstrap=timer).predict_ttft_ms(isl, isl, 8192)
    assert estimate.upper_ms > 1e6 and not math.isnan(estimate.upper_ms)
    assert timer.ttft_ms(isl, 8192) > 1e6


def test_prefill_chunks_take_a_constant_number_of_steps() -> None:
    calls: list[tuple[float, float, float, float]] = []

    def step(load: tuple[float, float, float, float]) -> float:
        calls.append(load)
        return 1.0 + load[0] * 0.01

    prefill_chunks_ms(step, 1e20, 1e20, 8192.0)
    assert len(calls) <= 4


@pytest.mark.timeout(30)
def test_agg_latency_with_non_finite_or_degenerate_input_is_saturated(timer: ProfileStepTimer) -> None:
    model = PerfModel(Role.AGG, bootstrap=timer)
    agg = predict_agg_latency(
        model,
        rate_per_s=math.nan,
        isl_tokens=1000,
        osl_tokens=100,
        kv_per_request_tokens=1000,
        max_num_batched_tokens=2048,
    )
    assert agg.saturated == "non-finite input" and math.isinf(agg.ttft_ms)
    tiny = predict_agg_latency(
        model,
        rate_per_s=1e-300,
        isl_tokens=1000,
        osl_tokens=100,
        kv_per_request_tokens=1000,
        max_num_batched_tokens=2048,
    )
    assert math.isfinite(tiny.itl_ms)


def _sla_fleet(role: Role, n: int = 4) -> Fleet:
    fleet = Fleet()
    fleet.add_many(n, role)
    fleet.deploy(role.value, n)
    return fleet


@pytest.mark.timeout(30)
@pytest.mark.parametrize("role", [Role.PREFILL, Role.AGG])
def test_one_sample_of_2_64_prefill_tokens_holds(timer: ProfileStepTimer, role: Role) -> None:
    """Issue 12 item 2: one FPM sample with ``sum_prefill_tokens = 2^64 - 1`` froze the SLA tick forever. Ingest
    may drop it (the worker is then silent) or pass it (the core then holds with ``load_invalid``): either way the
    tick answers and holds."""
    fleet = _sla_fleet(role)
    for i, wid in enumerate(fleet.workers):
        fleet.publish(wid, 0.0, Load(prefill=HUGE if i == 0 else 100, decode=4, kv=4000))
    config = CoreConfig(roles={role: RoleConfig(mode=Mode.SLA)})
    _, decisions = step(
        CoreState(), fleet.observe(0.0), 0.0, config, predictors={role: PerfModel(role, bootstrap=timer)}
    )
    (d,) = decisions
    assert d.final_replicas == 4 and d.action == Action.HOLD


@pytest.mark.timeout(30)
@pytest.mark.parametrize("role", [Role.PREFILL, Role.AGG])
def test_a_prompt_of_2_50_tokens_is_unreachable_not_a_hang(timer: ProfileStepTimer, role: Role) -> None:
    """The structural guard behind item 2: a load every check lets through (2^50 scheduled prefill tokens over 4
    prompts) still predicts in closed form: no count meets the TTFT, so the core holds with ``sla_unreachable``."""
    fleet = _sla_fleet(role)
    fleet.publish_all(0.0, Load(prefill=400, decode=16, kv=16_000))
    observation = Observation(
        workers=dict(fleet.workers),
        fleet=fleet.store.snapshot(0.0),
        deployments=dict(fleet.deployments),
        load_override={role: RoleLoad(scheduled_prefill_tokens=2.0**50, decode_requests=16, decode_kv_tokens=16_000)},
    )
    config = CoreConfig(roles={role: RoleConfig(mode=Mode.SLA)})
    _, decisions = step(CoreState(), observation, 0.0, config, predictors={role: PerfModel(role, bootstrap=timer)})
    (d,) = decisions
    assert d.final_replicas == 4 and Reason.SLA_UNREACHABLE in d.reasons


@pytest.mark.parametrize("role", [Role.DECODE, Role.AGG])
def test_a_subnormal_decode_count_does_not_overflow_the_kv_per_request(timer: ProfileStepTimer, role: Role) -> None:
    """Found by the reliability property's example database: 1 KV token over 5e-324 decoding requests made the KV
    per request infinite, and the step model refused the load (InvalidLoadError: the tick was lost). The KV per
    request falls back to the prompt length; the tick answers with an SLA recommendation."""
    fleet = _sla_fleet(role)
    fleet.publish_all(0.0, Load(decode=0, kv=0))
    observation = Observation(
        workers=dict(fleet.workers),
        fleet=fleet.store.snapshot(0.0),
        deployments=dict(fleet.deployments),
        load_override={role: RoleLoad(decode_requests=5e-324, decode_kv_tokens=1.0)},
    )
    config = CoreConfig(roles={role: RoleConfig(mode=Mode.SLA, max_replicas=12)})
    _, decisions = step(CoreState(), observation, 0.0, config, predictors={role: PerfModel(role, bootstrap=timer)})
    (d,) = decisions
    assert d.mode == Mode.SLA and Reason.LOAD_INVALID not in d.reasons
    assert 0 <= d.final_replicas <= 12


@pytest.mark.timeout(30)
def test_what_if_on_a_role_without_workers_prefills_in_a_sane_chunk(timer: ProfileStepTimer) -> None:
    """Issue 12 item 3: no discovered prefill worker made the chunk 1 token, so a 1e9-token what-if never answered."""
    fleet = Fleet()
    fleet.deploy("prefill", 2)
    config = CoreConfig(roles={Role.PREFILL: RoleConfig(mode=Mode.SLA, service="prefill", max_replicas=8)})
    observation = Observation(
        workers={},
        fleet=fleet.store.snapshot(0.0),
        deployments=dict(fleet.deployments),
        traffic={Role.PREFILL: Traffic(request_rate_per_s=0.0, isl_tokens=1e9)},
        load_override={Role.PREFILL: RoleLoad(queued_prefill_tokens=1.0)},
    )
    _, decisions = step(
        CoreState(), observation, 0.0, config, predictors={Role.PREFILL: PerfModel(Role.PREFILL, bootstrap=timer)}
    )
    (d,) = decisions
    assert d.mode == Mode.SLA
    assert d.recommended_replicas == 2 and Reason.SLA_UNREACHABLE in d.reasons  # no count prefills 1e9 tokens in 500 ms


@pytest.mark.parametrize("bad", [math.nan, math.inf, -5.0, float(HUGE)])
@pytest.mark.parametrize("field", ["queued_prefill_tokens", "decode_requests", "decode_kv_tokens"])
def test_a_non_finite_load_override_holds_never_scales_to_zero(bad: float, field: str) -> None:
    """Issue 12 item 12: a NaN load override recommended 0 and scaled 4 -> 1; inf raised."""
    fleet = _sla_fleet(Role.AGG)
    config = CoreConfig(roles={Role.AGG: RoleConfig(mode=Mode.THRESHOLD, min_replicas=1, scale_down=FAST_DOWN)})
    state = CoreState()
    for now in (0.0, 5.0):
        fleet.publish_all(now, Load(decode=40, kv=40_000))
        observation = Observation(
            workers=dict(fleet.workers),
            fleet=fleet.store.snapshot(now),
            deployments=dict(fleet.deployments),
            load_override={Role.AGG: RoleLoad(**{field: bad})},
        )
        state, decisions = step(state, observation, now, config)
        (d,) = decisions
        assert d.recommended_replicas == 4 and d.final_replicas == 4
        assert d.reasons[0] == Reason.LOAD_INVALID and d.action == Action.HOLD


def test_non_finite_or_absurd_traffic_is_unknown() -> None:
    cleaned = Traffic(request_rate_per_s=math.inf, isl_tokens=math.nan, osl_tokens=1e30, isl_tokens_p99=2.0**40).clean()
    assert cleaned.request_rate_per_s is None and cleaned.isl_tokens is None
    assert cleaned.osl_tokens is None and cleaned.isl_tokens_p99 is None
    assert Traffic(request_rate_per_s=10.0, isl_tokens=3000.0).clean().isl_tokens == 3000.0


def test_actuator_bounds_cap_the_core() -> None:
    """Issue 12 item 5: the core kept its max 64, asked for 12 against an actuator allowing 8 and was refused every
    tick; the effective max is now the actuator's, with a reason."""
    fleet = _sla_fleet(Role.AGG, 6)
    fleet.publish_all(0.0, Load(decode=6 * 256, kv=6 * 20_000, queued_decode=60))
    base = CoreConfig(roles={Role.AGG: RoleConfig(mode=Mode.THRESHOLD, max_replicas=64)})
    _, (free,) = step(CoreState(), fleet.observe(0.0), 0.0, base)
    assert free.final_replicas > 8
    config = base.with_actuator_bounds({Role.AGG: RoleBounds(min_replicas=0, max_replicas=8)})
    assert config.role(Role.AGG).effective_bounds == RoleBounds(min_replicas=1, max_replicas=8)
    _, (d,) = step(CoreState(), fleet.observe(0.0), 0.0, config)
    assert d.final_replicas == 8 and Reason.CAPPED_BY_ACTUATOR_BOUNDS in d.reasons
    bounds = d.stage(Stage.BOUNDS)
    assert bounds is not None and bounds.reason == Reason.CAPPED_BY_ACTUATOR_BOUNDS
    # A run-time PATCH of the core's bounds keeps the actuator's cap.
    patched = config.with_bounds(config.bounds())
    assert patched.role(Role.AGG).actuator_bounds == RoleBounds(min_replicas=0, max_replicas=8)


def test_bounds_that_do_not_intersect_the_actuators_are_refused() -> None:
    config = CoreConfig(roles={Role.AGG: RoleConfig(min_replicas=10, max_replicas=20)})
    with pytest.raises(CoreConfigError, match="do not intersect"):
        config.with_actuator_bounds({Role.AGG: RoleBounds(min_replicas=0, max_replicas=8)})
