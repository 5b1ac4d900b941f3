"""One service's pipeline (planner.core.draft) where its stages hand each other what they know: the tail's misses
add replicas only with no capacity coming, the closed loop holds while a backlog left by a scale-up drains, its
corrected count keeps the prompts' spread, and a load it cannot trust is held in the mode it can run, saying where
the load came from. Written for the mutants docs/mutation-results.md listed as surviving in draft.py; every load
goes through a real FleetStore (tests/core/fleetkit.py) except the measured-but-broken one, which the store never
lets through and which is handed to ``draft_service`` as reconcile's output."""

from __future__ import annotations

import math

import msgspec
import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import CoreConfig, CoreState, Mode, Reason, RoleLoad, SlaTargets, Stage, Traffic, step
from planner.core.draft import draft_service
from planner.core.feedback import FeedbackState
from planner.core.state import ServiceState
from planner.discovery import EngineCapacity, Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import H200_PROFILE, Fleet, Load, hpa_role, reconciled

H200 = EngineCapacity(max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=131_072, kv_capacity_tokens=945_029)


def prefill_fleet(replicas: int) -> Fleet:
    fleet = Fleet()  # engines with an 8192-token chunk (fleetkit's CAPACITY)
    fleet.add_many(replicas, Role.PREFILL)
    fleet.deploy("prefill", replicas)
    return fleet


def sla_prefill(ttft_ms: float, **kw: object) -> CoreConfig:
    return CoreConfig(roles={Role.PREFILL: hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=ttft_ms, itl_ms=50.0), **kw)})


def test_the_tail_adds_replicas_only_when_no_capacity_is_coming() -> None:
    # 8 aggregated H200 engines, 12 prompts/s of 12k tokens with short outputs (median 20 tokens), 2 % of the
    # requests observed missing their ITL (test_core_tail.py's case): the tail asks for more than 8 once the
    # deployment has settled; while a scale is in flight the misses predate the capacity coming, and it keeps 8.
    model = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    traffic = Traffic(
        request_rate_per_s=12.0,
        isl_tokens=12_000.0,
        osl_tokens=69.0,
        osl_tokens_p50=20.0,
        osl_tokens_p90=180.0,
        osl_tokens_p99=600.0,
        itl_attainment_frac=0.98,
        itl_samples_in_window=500,
    )
    config = CoreConfig(roles={Role.AGG: hpa_role(mode=Mode.SLA, sla=SlaTargets(ttft_ms=2000, itl_ms=50))})

    def recommended(in_flight: bool) -> tuple[int, Reason]:
        fleet = Fleet()
        for i in range(8):
            fleet.add(f"agg-{i}", Role.AGG, capacity=H200)
        fleet.deploy("agg", 8, in_flight=in_flight)
        fleet.publish_all(0.0, Load())
        _, decisions = fleet.tick(CoreState(), 0.0, config, {Role.AGG: traffic}, predictors={Role.AGG: model})
        stage = decisions["agg"].stage(Stage.RECOMMEND)
        assert stage is not None and stage.reason is not None
        return stage.replicas, stage.reason

    settled, reason = recommended(in_flight=False)
    assert settled > 8 and reason == Reason.SLA_NEEDS_MORE
    assert recommended(in_flight=True) == (8, Reason.SLA_MET)


def test_the_loop_holds_while_the_backlog_left_by_a_scale_up_drains_within_a_start_up() -> None:
    # The last scale-up settled 5 s ago; the prefill queue fell from 1M to 500k tokens since: 100k tokens/s, gone
    # in 5 s, within the 60 s start-up. Half the requests missing their TTFT are the backlog's: no tightening.
    fleet = prefill_fleet(2)
    fleet.publish_all(5.0, Load(queued_prefill=500_000))
    config = sla_prefill(500.0, startup_s=60.0)
    before = FeedbackState(last_at=0.0, in_flight_at=0.0, queued_prefill_tokens=1_000_000.0)
    state = CoreState(services={"prefill": ServiceState(feedback=before)})
    traffic = Traffic(
        request_rate_per_s=2.0,
        isl_tokens=2000.0,
        osl_tokens=100.0,
        ttft_attainment_frac=0.5,
        ttft_samples_in_window=500,
    )
    new_state, decisions = fleet.tick(
        state, 5.0, config, {Role.PREFILL: traffic}, predictors={Role.PREFILL: AnalyticPerf()}
    )
    stage = decisions["prefill"].stage(Stage.SLA_FEEDBACK)
    assert stage is not None and stage.reason == Reason.SLA_FEEDBACK_FROZEN
    assert stage.detail is not None
    assert "not tightening: the backlog left from before the capacity came drains in 5 s, within a start-up (60 s)" in (
        stage.detail
    )
    assert new_state.services["prefill"].feedback.ttft_frac == 0.0
    assert new_state.services["prefill"].feedback.queued_prefill_tokens == 500_000.0


def test_the_loops_corrected_count_keeps_the_prompts_spread() -> None:
    # 4 prefill replicas (8192-token chunks: 10 + 163.84 ms, 47,124 tokens/s each), 30 prompts/s of 2000 tokens;
    # half the requests miss their TTFT, so the loop tightens the headroom to its bound (0.6): 250 ms x 0.4 = 100.
    # The prompts' spread (p50 1200, p90 4000: CV^2 = exp(0.939^2) - 1 = 1.42) multiplies the M/D/1 wait: at 2
    # replicas (utilization 0.64, 0.56 prompts queued) 1.1 x (10 + 0.02 x (2000 + 2.42 x 1115)) = 114 ms misses
    # the corrected target, without the spread 1.1 x (10 + 0.02 x 3115) = 79.5 ms meets it.
    traffic = Traffic(
        request_rate_per_s=30.0,
        isl_tokens=2000.0,
        osl_tokens=100.0,
        isl_tokens_p50=1200.0,
        isl_tokens_p90=4000.0,
        ttft_attainment_frac=0.5,
        ttft_samples_in_window=500,
    )

    def corrected(prompt_spread_window_s: float) -> int:
        fleet = prefill_fleet(4)
        fleet.publish_all(5.0, Load(queued_prefill=4000))
        state = CoreState(services={"prefill": ServiceState(feedback=FeedbackState(last_at=0.0))})
        _, decisions = fleet.tick(
            state,
            5.0,
            sla_prefill(250.0, prompt_spread_window_s=prompt_spread_window_s),
            {Role.PREFILL: traffic},
            predictors={Role.PREFILL: AnalyticPerf()},
        )
        stage = decisions["prefill"].stage(Stage.SLA_FEEDBACK)
        assert stage is not None and stage.reason == Reason.SLA_FEEDBACK_CLAMPED
        return stage.replicas

    assert (corrected(120.0), corrected(0.0)) == (3, 2)


@pytest.mark.parametrize(("predictor", "mode"), [(None, Mode.THRESHOLD), (AnalyticPerf(), Mode.SLA)])
def test_a_load_it_cannot_trust_is_held_in_the_mode_it_can_run(predictor: AnalyticPerf | None, mode: Mode) -> None:
    # SLA mode asked for, a given load with a NaN queue: held at the current 2, in threshold mode without a perf
    # model (SLA mode cannot run), in SLA mode with one.
    fleet = prefill_fleet(2)
    fleet.publish_all(0.0, Load(queued_prefill=1000))
    observation = msgspec.structs.replace(
        fleet.observe(0.0), load_override={Role.PREFILL: RoleLoad(queued_prefill_tokens=math.nan)}
    )
    predictors = {Role.PREFILL: predictor} if predictor is not None else None
    _, (decision,) = step(CoreState(), observation, 0.0, sla_prefill(500.0), predictors=predictors)
    stage = decision.stage(Stage.RECOMMEND)
    assert stage is not None
    assert (decision.mode, stage.reason, stage.replicas) == (mode, Reason.LOAD_INVALID, 2)
    assert stage.detail == "given load not usable (queued_prefill_tokens=nan); holding at 2"


def test_a_measured_load_it_cannot_trust_says_it_was_measured() -> None:
    # The store drops a broken counter before reconcile sums it; were reconcile ever to hand over an infinite
    # queue, the hold says the load was measured (not given through /v1/what-if).
    fleet = prefill_fleet(2)
    fleet.publish_all(0.0, Load(queued_prefill=1000))
    recon = msgspec.structs.replace(
        reconciled(Role.PREFILL, 2, prefill_requests=1.0), load=RoleLoad(queued_prefill_tokens=math.inf)
    )
    draft = draft_service(
        Role.PREFILL,
        "prefill",
        list(fleet.workers.values()),
        fleet.observe(0.0),
        0.0,
        sla_prefill(500.0),
        ServiceState(),
        0.0,
        AnalyticPerf(),
        {"prefill": recon},
    )
    assert (draft.rec.replicas, draft.rec.reason) == (2, Reason.LOAD_INVALID)
    assert draft.stages[0].detail == "measured load not usable (queued_prefill_tokens=inf); holding at 2"


def test_each_scale_up_measures_its_own_start_up() -> None:
    # Threshold mode (205 decodes per replica): 800 decodes ask 4 of 2 replicas at t = 0, 1600 ask 8 of 4 at
    # t = 1000; each time the new replicas are ready 60 s after the decision. Both start-ups measure 60 s: the
    # second is timed from its own decision, not from the first's.
    fleet = Fleet()
    fleet.add_many(2, Role.DECODE)
    fleet.deploy("decode", 2)
    config = CoreConfig(roles={Role.DECODE: hpa_role()})
    state = CoreState()
    measured: list[tuple[int, float | None]] = []
    for start, load in ((0.0, Load(decode=800)), (1000.0, Load(decode=1600))):
        fleet.publish_all(start, load)
        state, decisions = fleet.tick(state, start, config)
        decision = decisions["decode"]
        fleet.deploy("decode", decision.final_replicas, ready=fleet.deployments["decode"].desired, in_flight=True)
        for now in (start + 10.0, start + 30.0):
            fleet.publish_all(now, load)
            state, _ = fleet.tick(state, now, config)
        fleet.apply(decision)
        fleet.publish_all(start + 60.0, load)
        state, _ = fleet.tick(state, start + 60.0, config)
        measured.append((decision.final_replicas, state.services["decode"].startup_s_observed))
    assert measured == [(4, 60.0), (8, 60.0)]
