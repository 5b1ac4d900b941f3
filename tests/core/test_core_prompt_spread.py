"""The prefill queue's wait with the prompts' spread (issue 13 items 3a, 6; planner.core.prompt_spread): a prefill
engine is a single-server queue whose service time is the prompt's, so its mean wait is Pollaczek-Khinchine's,
the M/D/1 wait times 1 + CV^2. Sized at the mean prompt with an M/D/1 wait, Mooncake's heavy-tailed prompts (p50
11.6k, p90 38.6k tokens) got a prefill fleet whose p50 TTFT was 3-9 s against a 2000 ms target. The spread is an
EWMA over windows: one window's p90 is a few prompts, and sized with it alone a prefill fleet went 7 -> 35 -> 113."""

from __future__ import annotations

import math

import pytest

from perf_model.model import PerfModel
from planner.core import CoreConfig, CoreState, Mode, RoleConfig, SlaTargets, Stage, Traffic
from planner.core.prompt_spread import service_cv2, update_log_var, window_log_var
from planner.discovery import Role
from tests.core.fleetkit import Fleet, Load

NARROW = Traffic(
    request_rate_per_s=20.0, isl_tokens=15000.0, osl_tokens=200.0, isl_tokens_p50=15000.0, isl_tokens_p90=15000.0
)
HEAVY = Traffic(
    request_rate_per_s=20.0, isl_tokens=15000.0, osl_tokens=200.0, isl_tokens_p50=11600.0, isl_tokens_p90=38600.0
)


def _config(role: Role, window_s: float = 120.0) -> CoreConfig:
    return CoreConfig(
        roles={
            role: RoleConfig(
                mode=Mode.SLA,
                sla=SlaTargets(ttft_ms=2000.0, itl_ms=50.0),
                max_replicas=256,
                prompt_spread_window_s=window_s,
            )
        }
    )


def _recommended(model: PerfModel, role: Role, windows: list[Traffic], window_s: float = 120.0) -> list[int]:
    fleet = Fleet()
    fleet.add_many(8, role)
    fleet.deploy(role.value, 8)
    config = _config(role, window_s)
    state = CoreState()
    out: list[int] = []
    for tick, traffic in enumerate(windows):
        now = 5.0 * tick
        fleet.publish_all(now, Load(prefill=1))
        state, decisions = fleet.tick(state, now, config, {role: traffic}, predictors={role: model})
        stage = decisions[role.value].stage(Stage.RECOMMEND)
        assert stage is not None
        out.append(stage.replicas)
    return out


def test_heavy_tailed_prompts_get_more_prefill_replicas_than_their_mean_alone(prefill_model: PerfModel) -> None:
    """Same rate and mean prompt; the heavy tail's CV^2 (~1.4) waits 2.4x the M/D/1 queue: more replicas. Before,
    the spread did not count (the same count for both)."""
    narrow = _recommended(prefill_model, Role.PREFILL, [NARROW] * 3)[-1]
    heavy = _recommended(prefill_model, Role.PREFILL, [HEAVY] * 3)[-1]
    assert heavy > narrow
    off = _recommended(prefill_model, Role.PREFILL, [HEAVY] * 3, window_s=0.0)[-1]
    assert off == narrow  # prompt_spread_window_s 0: the M/D/1 wait at the mean


def test_one_wide_window_moves_the_spread_by_its_share_of_the_span(prefill_model: PerfModel) -> None:
    """An hour of heavy-tailed windows, then one whose p90 is 10x its p50 (a few long prompts): the count moves
    by far less than sized with that window alone."""
    wide = Traffic(
        request_rate_per_s=20.0, isl_tokens=15000.0, osl_tokens=200.0, isl_tokens_p50=8000.0, isl_tokens_p90=80000.0
    )
    steady = _recommended(prefill_model, Role.PREFILL, [HEAVY] * 60)
    after = _recommended(prefill_model, Role.PREFILL, [HEAVY] * 59 + [wide])
    alone = _recommended(prefill_model, Role.PREFILL, [wide] * 3)[-1]
    assert alone > steady[-1]
    assert after[-1] - steady[-1] < (alone - steady[-1]) / 4


def test_the_recommend_stage_names_the_spread_it_sized_with(prefill_model: PerfModel) -> None:
    """The explanation shows the factor the queue wait was scaled by (CV^2 of the heavy tail: e^sigma^2 - 1, sigma
    from ln(38.6k / 11.6k) / z90), and none for a window of one prompt length."""
    fleet = Fleet()
    fleet.add_many(8, Role.PREFILL)
    fleet.deploy("prefill", 8)
    details = []
    for traffic in (HEAVY, NARROW):
        fleet.publish_all(0.0, Load(prefill=1))
        _, decisions = fleet.tick(
            CoreState(), 0.0, _config(Role.PREFILL), {Role.PREFILL: traffic}, predictors={Role.PREFILL: prefill_model}
        )
        stage = decisions["prefill"].stage(Stage.RECOMMEND)
        assert stage is not None
        details.append(stage.detail)
    cv2 = math.expm1((math.log(38600.0 / 11600.0) / 1.2815515655446004) ** 2)
    assert f"queue wait x{1.0 + cv2:.2f} for the prompts' spread (CV^2 {cv2:.2f})" in details[0]
    assert "prompts' spread" not in details[1]


def test_the_aggregated_role_is_not_sized_with_the_spread(prefill_model: PerfModel) -> None:
    assert _recommended(prefill_model, Role.AGG, [HEAVY] * 3) == _recommended(prefill_model, Role.AGG, [NARROW] * 3)


def test_the_spread_ewma() -> None:
    assert window_log_var(HEAVY) == pytest.approx((math.log(38600 / 11600) / 1.2815515655446004) ** 2)
    assert window_log_var(NARROW) == 0.0
    assert window_log_var(Traffic(request_rate_per_s=1.0, isl_tokens=100.0)) is None
    assert service_cv2(window_log_var(HEAVY)) == pytest.approx(1.4, abs=0.1)  # Mooncake's CV^2
    value, at = update_log_var(None, None, HEAVY, 10.0, 300.0)
    assert (value, at) == (window_log_var(HEAVY), 10.0)
    later, later_at = update_log_var(value, at, NARROW, 40.0, 300.0)
    assert later == pytest.approx(value * math.exp(-30.0 / 300.0)) and later_at == 40.0
    assert update_log_var(later, later_at, None, 50.0, 300.0) == (later, later_at)  # no percentiles: kept
    assert service_cv2(None) == 0.0 and service_cv2(math.nan) == 0.0
