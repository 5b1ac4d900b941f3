"""Rows for planner/core/recommend.py's survivors of the 1-in-10 sample after 5bb0a07 and dffeea5 renumbered it
(docs/testing.md, mutation testing): what a backlog-capped answer reports as its mode, a prompt spread that is not
a number, engines that report no ``max_num_seqs``, the ITL floor of an aggregated engine, the ITL tail's scale
on replicas of several ranks, and a floor at the limit. Each fails on the mutant it was written for."""

from __future__ import annotations

import math

import msgspec

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core import Mode, Reason, RoleLoad, SlaTargets, Traffic
from planner.core.recommend import recommend_sla
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import H200_PROFILE, Load, reconciled
from tests.core.test_core_mutants_recommend_sla import MOONCAKE
from tests.core.test_core_rows_threshold import reconciled as reconciled_load

PREFILL_SLA = SlaTargets(ttft_ms=500.0, itl_ms=50.0)
DECODE_SLA = SlaTargets(ttft_ms=2000.0, itl_ms=50.0)


def test_a_backlog_capped_answer_is_an_sla_mode_answer() -> None:
    """2 prefill replicas (2 DP ranks each) drain 1M queued tokens in 12 s, before the 60 s start-up: the backlog
    cap answers 2, and it is the SLA mode's answer like any other (the service's mode gauge reads it)."""
    rec = msgspec.structs.replace(reconciled(Role.PREFILL, 4, prefill_requests=500.0), dp_per_replica=2)
    out = recommend_sla(
        Role.PREFILL,
        2,
        rec,
        RoleLoad(queued_prefill_tokens=1_000_000.0),
        Traffic(request_rate_per_s=40.0, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        PREFILL_SLA,
        0.0,
        64,
        startup_s=60.0,
    )
    assert (out.replicas, out.reason, out.mode) == (2, Reason.BACKLOG_DRAINS_BEFORE_STARTUP, Mode.SLA)


def test_a_prompt_spread_that_is_not_a_number_adds_no_queue_wait() -> None:
    """A CV^2 of NaN (a spread that could not be computed) is no spread: the same answer and detail as 0, with no
    queue-wait factor named; a real spread of 1 names it."""
    rec = reconciled(Role.PREFILL, 2, prefill_requests=0.0)
    traffic = Traffic(request_rate_per_s=20.0, isl_tokens=2000.0, osl_tokens=100.0)

    def ask(cv2: float) -> tuple[int, Reason, str]:
        out = recommend_sla(
            Role.PREFILL, 2, rec, RoleLoad(), traffic, AnalyticPerf(), PREFILL_SLA, 0.0, 64, prompt_cv2=cv2
        )
        return out.replicas, out.reason, out.detail

    plain = ask(0.0)
    assert "queue wait" not in plain[2]
    assert ask(math.nan) == plain
    assert "queue wait x2.00 for the prompts' spread (CV^2 1.00)" in ask(1.0)[2]


def test_engines_reporting_no_max_num_seqs_are_sized_by_their_itl_alone() -> None:
    """A decode fleet whose engines report no max_num_seqs (the reconciled limit is 0: unknown) has no batch
    limit to check: 400 decodes on a step of 16 + 0.1 R + 0.0001 KV ms meet 50 ms at 3 replicas (16 + 80 / 3 =
    42.7 ms), as with a limit far above the batch; a limit of 0 read as a limit would rule every count out."""
    base = reconciled_load(Role.DECODE, 4, Load(decode=400, kv=400_000))
    traffic = Traffic(request_rate_per_s=1.0, isl_tokens=1000.0, osl_tokens=100.0)
    perf = AnalyticPerf(decode_base_ms=16.0, band_frac=0.0)

    def ask(max_num_seqs: float) -> tuple[int, Reason, str]:
        rec = msgspec.structs.replace(base, max_num_seqs=max_num_seqs)
        out = recommend_sla(Role.DECODE, 4, rec, rec.load, traffic, perf, DECODE_SLA, 0.0, 64)
        return out.replicas, out.reason, out.detail

    unknown = ask(0.0)
    assert unknown[:2] == (3, Reason.SLA_ALLOWS_FEWER)
    assert unknown == ask(1e9)


def test_an_aggregated_engines_itl_floor_is_one_sequence_decoding_alone() -> None:
    """The floor a tightened ITL limit is taken over (planner.core.latency_floor) is the step of one sequence
    decoding alone, nothing else in it: on an aggregated engine's step model too, the decode-only step of one
    sequence holding the mean KV (1,500 tokens), no prefill token riding along."""
    model = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    load = RoleLoad(decode_requests=380, decode_kv_tokens=380 * 1500)
    traffic = Traffic(request_rate_per_s=20.0, isl_tokens=1150.0, osl_tokens=700.0)
    rec = reconciled(Role.AGG, 2, prefill_requests=2.0)
    out = recommend_sla(Role.AGG, 2, rec, load, traffic, model, DECODE_SLA, 0.0, 64, itl_correction_frac=0.2)
    assert out.itl_floor_ms is not None
    assert out.itl_floor_ms == model.predict_itl_ms(1.0, 1500.0).upper_ms
    assert out.itl_floor_ms < model.predict_step_ms(1.0, 0.0, 1.0, 1500.0).upper_ms  # a prefill token costs time


def test_the_itl_tails_scale_is_taken_per_engine_on_replicas_of_several_ranks() -> None:
    """The Mooncake-like traffic of test_core_mutants_recommend_sla on 24 aggregated engines, as 24 replicas of
    one rank or 12 of two: the tail's scale is taken at today's per-engine rate (the rate over every rank), so the
    two fleets ask the same engines, in replicas of their size (a shortfall of 2 %: 32 engines; all met: 16)."""
    model = PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))
    load = RoleLoad(decode_requests=2.0 * 24, decode_kv_tokens=2.0 * 24 * 16_000)  # 2 decodes per engine now

    def ask(replicas: int, dp: int, attainment: float) -> int:
        rec = msgspec.structs.replace(reconciled(Role.AGG, replicas * dp, prefill_requests=96.0), dp_per_replica=dp)
        traffic = Traffic(**MOONCAKE, itl_attainment_frac=attainment, itl_samples_in_window=500)  # type: ignore[arg-type]
        return recommend_sla(Role.AGG, replicas, rec, load, traffic, model, DECODE_SLA, 0.0, 256).replicas

    assert (ask(24, 1, 0.98), ask(12, 2, 0.98)) == (32, 16)
    assert (ask(24, 1, 1.0), ask(12, 2, 1.0)) == (16, 8)


def test_a_tightening_over_a_floor_at_the_limit_names_no_floor() -> None:
    """A floor at or above the configured limit leaves a tightening as before (planner.core.latency_floor): one
    sequence of 20,000 KV tokens decodes in 30 + 20 = 50 ms, the whole 50 ms limit, so a +0.2 correction asks
    40 ms of the target as without a floor. One request spread over 2 engines (10,000 KV tokens each: 40 ms)
    meets it; the answer names no floor and carries none (the closed loop's detail says nothing of one)."""
    rec = reconciled_load(Role.DECODE, 4, Load(decode=1, kv=20_000))
    perf = AnalyticPerf(decode_base_ms=30.0, decode_ms_per_request=0.0, decode_ms_per_kv_token=0.001, band_frac=0.0)
    out = recommend_sla(Role.DECODE, 4, rec, rec.load, None, perf, DECODE_SLA, 0.0, 64, itl_correction_frac=0.2)
    assert (out.replicas, out.reason, out.itl_floor_ms) == (2, Reason.SLA_ALLOWS_FEWER, None)
    assert out.detail == "2 replicas: ITL 40.0 ms <= 40.0"
