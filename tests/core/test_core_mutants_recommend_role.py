"""The recommend stage's call for one role (planner.core.recommend_role): the search reaches four times the larger of
the role's maximum and today's count, and the role's settings (its default chunk, the closed loop's corrections,
the tail's sample minimum) and the caller's (capacity still coming) reach SLA mode. Written for the mutants of
recommend_role.py that survived the suite (docs/mutation-results.md).

Decode rows use the analytic predictor of tests/core/analytic_perf.py: 300 decoding requests holding 1000 KV
tokens each on N replicas step in 1.1 x (8 + 30/N + 30/N) ms, within 20 ms first at N = 6 (19.9 ms)."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import Mode, Reason, RoleLoad, SlaTargets, Traffic
from planner.core.config import RoleConfig, SlaFeedbackConfig
from planner.core.recommend_role import recommend_role
from planner.core.recommendation import Recommendation
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import H200_PROFILE, hpa_role, reconciled

DECODE_300 = RoleLoad(decode_requests=300.0, decode_kv_tokens=300_000.0)


def sla_role(**kw: object) -> RoleConfig:
    return hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=500.0, itl_ms=20.0), **kw)


def decode(current: int, max_replicas: int) -> Recommendation:
    rc = sla_role(max_replicas=max_replicas)
    recon = reconciled(Role.DECODE, current, prefill_requests=0.0)
    rec, extra = recommend_role(Role.DECODE, rc, current, recon, DECODE_300, None, AnalyticPerf())
    assert extra == ()
    return rec


def test_the_search_reaches_four_times_the_roles_maximum() -> None:
    # max_replicas 1: the search stops at 4, short of the 6 the load needs, and says so.
    rec = decode(1, 1)
    assert (rec.replicas, rec.reason, rec.detail) == (4, Reason.SLA_NEEDS_MORE, "more than 4 replicas needed")


def test_the_search_reaches_four_times_todays_count_above_the_maximum() -> None:
    # 10 replicas running above a maximum of 1 (an operator lowered it): the search reaches 40 and finds the 6.
    rec = decode(10, 1)
    assert (rec.replicas, rec.reason) == (6, Reason.SLA_ALLOWS_FEWER)
    assert rec.predicted_itl_ms == pytest.approx(1.1 * (8 + 60 / 6))


def test_the_roles_default_chunk_sizes_a_role_no_engine_reports_for() -> None:
    # No engine reports a chunk (max_num_batched_tokens 0): a 4000-token prompt takes two 2048-token chunks,
    # 1.1 x (2 x 10 + 0.02 x 4000) = 110 ms (one 8192-token chunk would give 99 ms).
    rc = sla_role(default_max_num_batched_tokens=2048)
    recon = reconciled(Role.PREFILL, 1, prefill_requests=0.0, max_num_batched_tokens=0.0)
    traffic = Traffic(request_rate_per_s=0.001, isl_tokens=4000.0, osl_tokens=10.0)
    rec, _ = recommend_role(Role.PREFILL, rc, 1, recon, RoleLoad(), traffic, AnalyticPerf())
    assert rec.predicted_ttft_ms == pytest.approx(110.0, abs=0.01)


def test_the_loops_ttft_correction_tightens_the_ttft_target() -> None:
    recon = reconciled(Role.PREFILL, 2, prefill_requests=20.0)
    load = RoleLoad(queued_prefill_tokens=40_000.0)
    rec, _ = recommend_role(Role.PREFILL, sla_role(), 2, recon, load, None, AnalyticPerf(), (0.5, 0.0))
    assert rec.detail.endswith("<= 250.0")  # 500 ms x (1 - 0.5)
    plain, _ = recommend_role(Role.PREFILL, sla_role(), 2, recon, load, None, AnalyticPerf())
    assert plain.detail.endswith("<= 500.0")


def test_by_default_no_start_up_delay_and_no_prompt_spread() -> None:
    # A queue on one replica that a 1 s start-up or a prompt spread (CV^2 1) would change: the count above today's
    # is judged against today's whole queue, behind an M/D/1 wait.
    rc = sla_role()
    recon = reconciled(Role.PREFILL, 1, prefill_requests=50.0)
    load = RoleLoad(queued_prefill_tokens=100_000.0)
    traffic = Traffic(request_rate_per_s=10.0, isl_tokens=2000.0, osl_tokens=100.0)
    default, _ = recommend_role(Role.PREFILL, rc, 1, recon, load, traffic, AnalyticPerf())
    explicit, _ = recommend_role(
        Role.PREFILL, rc, 1, recon, load, traffic, AnalyticPerf(), startup_s=0.0, tail_may_raise=True, prompt_cv2=0.0
    )
    assert default == explicit
    assert default.replicas > 1 and default.reason == Reason.SLA_NEEDS_MORE
    later, _ = recommend_role(Role.PREFILL, rc, 1, recon, load, traffic, AnalyticPerf(), startup_s=1.0)
    spread, _ = recommend_role(Role.PREFILL, rc, 1, recon, load, traffic, AnalyticPerf(), prompt_cv2=1.0)
    assert later.predicted_ttft_ms != default.predicted_ttft_ms  # the backlog left after 1 s, not today's
    assert "for the prompts' spread (CV^2 1.00)" in spread.detail and "spread" not in default.detail


# Aggregated engines with the step model of the measured H200 profile, under test_core_tail.py's short outputs
# behind long prompts: 2 % of 500 requests missing their ITL on 8 replicas.
TAIL = Traffic(
    request_rate_per_s=12.0,
    isl_tokens=12_000.0,
    osl_tokens=69.0,
    osl_tokens_p50=20.0,
    osl_tokens_p90=180.0,
    osl_tokens_p99=600.0,
    itl_attainment_frac=0.98,
    itl_samples_in_window=500,
)


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


def agg8(model: PerfModel, rc: RoleConfig, **kw: bool) -> int:
    recon = reconciled(Role.AGG, 8, prefill_requests=32.0)
    rec, _ = recommend_role(Role.AGG, rc, 8, recon, RoleLoad(), TAIL, model, **kw)  # type: ignore[arg-type]
    return rec.replicas


def test_the_tail_may_raise_the_count_unless_capacity_is_coming(model: PerfModel) -> None:
    rc = hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=2000, itl_ms=50))
    assert agg8(model, rc) > 8  # by default (nothing said to be coming)
    assert agg8(model, rc, tail_may_raise=True) > 8
    assert agg8(model, rc, tail_may_raise=False) == 8


def test_the_tail_rests_on_the_roles_sample_minimum(model: PerfModel) -> None:
    # 500 requests observed: enough for the default minimum (20), not for a role asking 1000 (the mean's check).
    sla = SlaTargets(ttft_ms=2000, itl_ms=50)
    strict = hpa_role(mode=Mode.SLA, sla=sla, sla_feedback=SlaFeedbackConfig(min_samples=1000))
    assert agg8(model, strict) < 8
    assert agg8(model, hpa_role(mode=Mode.SLA, sla=sla)) > 8


def test_the_tail_is_judged_against_the_roles_attainment_goal(model: PerfModel) -> None:
    # 98 % of the requests met their ITL: short of the default 99 % goal (the tail adds replicas), past a role's
    # 90 % (all met: the tail releases to where the predicted share is at most twice today's).
    sla = SlaTargets(ttft_ms=2000, itl_ms=50)
    lenient = hpa_role(mode=Mode.SLA, sla=sla, sla_feedback=SlaFeedbackConfig(attainment_goal=0.9))
    assert agg8(model, lenient) < 8
    assert agg8(model, hpa_role(mode=Mode.SLA, sla=sla)) > 8


def test_the_prompts_spread_widens_a_prefill_roles_queue_only() -> None:
    # The same queue and arrivals on a prefill role and on an aggregated one judged by TTFT and ITL alone (a
    # predictor without mixed steps): only the prefill role's M/D/1 wait is widened by the spread.
    load = RoleLoad(queued_prefill_tokens=20_000.0, decode_requests=10.0, decode_kv_tokens=10_000.0)
    traffic = Traffic(request_rate_per_s=10.0, isl_tokens=2000.0, osl_tokens=100.0)
    details = {}
    for role in (Role.PREFILL, Role.AGG):
        recon = reconciled(role, 2, prefill_requests=10.0)
        rec, _ = recommend_role(role, sla_role(), 2, recon, load, traffic, AnalyticPerf(), prompt_cv2=1.0)
        details[role] = rec.detail
    assert "for the prompts' spread (CV^2 1.00)" in details[Role.PREFILL]
    assert "spread" not in details[Role.AGG]


@pytest.mark.parametrize(
    ("mode", "ready", "extra"),
    [
        (Mode.AUTO, False, (Reason.PERF_MODEL_NOT_READY,)),  # auto with a model still learning: says so
        (Mode.SLA, False, (Reason.PERF_MODEL_NOT_READY,)),
        (Mode.THRESHOLD, True, ()),  # threshold mode asked for: a ready model is not missed
        (Mode.THRESHOLD, False, ()),
    ],
)
def test_threshold_mode_says_perf_model_not_ready_only_when_sla_mode_was_wanted(
    mode: Mode, ready: bool, extra: tuple[Reason, ...]
) -> None:
    rc = hpa_role(mode=mode, sla=SlaTargets(ttft_ms=500.0, itl_ms=20.0))
    recon = reconciled(Role.DECODE, 2, prefill_requests=0.0)
    rec, got = recommend_role(Role.DECODE, rc, 2, recon, DECODE_300, None, AnalyticPerf(ready=ready))
    assert (rec.mode, got) == (Mode.THRESHOLD, extra)
