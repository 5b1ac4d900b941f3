"""SLA mode row by row on ``recommend_sla`` (prefill and decode roles), with the analytic predictor of
tests/core/analytic_perf.py: a prefill of T tokens takes ``ceil(T / 8192) x 10 + 0.02 T`` ms, a decode step
``8 + 0.1 R + 0.0001 KV`` ms, upper band x1.1. Loads go through a real FleetStore and reconcile; every expected
count was worked out by hand from those formulas (the arithmetic is in each row's name or comment).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from perf_model.api import LatencyEstimate
from planner.core import Mode, Reason, SlaTargets, Traffic
from planner.core.recommend import AggLatency, predict_agg_latency, recommend_sla
from planner.discovery import EngineCapacity, Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Load
from tests.core.test_core_rows_threshold import reconciled

SLA = SlaTargets(ttft_ms=500.0, itl_ms=20.0)
DECODE_400 = Load(decode=400, kv=400_000)  # per engine at N replicas: 400/N requests, 400k/N KV tokens


@dataclass
class Row:
    name: str
    role: Role
    load: Load
    expected: int
    reason: Reason
    ttft_ms: float | None = None  # predicted, at the chosen count
    itl_ms: float | None = None
    current: int = 4
    sla: SlaTargets = SLA
    headroom_frac: float = 0.0
    itl_headroom_frac: float | None = None
    traffic: Traffic | None = None
    search_max: int = 64


ROWS = [
    Row(
        "decode: ITL 1.1 x (8 + 80/N) <= 20 first at N = 8 (19.8; 7 gives 21.4)",
        Role.DECODE,
        DECODE_400,
        8,
        Reason.SLA_NEEDS_MORE,
        itl_ms=19.8,
    ),
    Row(
        "decode with 10 % headroom: <= 18 first at N = 10 (17.6; 9 gives 18.6)",
        Role.DECODE,
        DECODE_400,
        10,
        Reason.SLA_NEEDS_MORE,
        itl_ms=17.6,
        headroom_frac=0.1,
    ),
    Row(
        "decode: its own ITL headroom (0) overrides the general one (0.1)",
        Role.DECODE,
        DECODE_400,
        8,
        Reason.SLA_NEEDS_MORE,
        itl_ms=19.8,
        headroom_frac=0.1,
        itl_headroom_frac=0.0,
    ),
    Row(
        "decode: an ITL headroom of its own (0.1) applies with no general one",
        Role.DECODE,
        DECODE_400,
        10,
        Reason.SLA_NEEDS_MORE,
        itl_ms=17.6,
        itl_headroom_frac=0.1,
    ),
    Row(
        "decode above the need scales down to it",
        Role.DECODE,
        DECODE_400,
        8,
        Reason.SLA_ALLOWS_FEWER,
        itl_ms=19.8,
        current=12,
    ),
    Row("decode at the need holds", Role.DECODE, DECODE_400, 8, Reason.SLA_MET, itl_ms=19.8, current=8),
    Row(
        "queued decode requests count as decoding, at the running ones' KV each (400 x 1000 tokens)",
        Role.DECODE,
        Load(decode=200, queued_decode=200, kv=200_000),
        8,
        Reason.SLA_NEEDS_MORE,
        itl_ms=19.8,
    ),
    Row(
        "decode past search_max but reachable: search_max, sla_needs_more",
        Role.DECODE,
        DECODE_400,
        5,
        Reason.SLA_NEEDS_MORE,
        itl_ms=1.1 * (8 + 80 / 5),
        search_max=5,
    ),
    Row(
        "decode at an ITL no count meets (8.8 ms alone > 8): hold at the current count",
        Role.DECODE,
        DECODE_400,
        4,
        Reason.SLA_UNREACHABLE,
        itl_ms=1.1 * (8 + 80 / 64),
        sla=SlaTargets(ttft_ms=500.0, itl_ms=8.0),
    ),
    Row("no load and no traffic", Role.DECODE, Load(), 0, Reason.NO_LOAD),
    Row(
        "decode with traffic: Little's law, two rounds from 100 req/s x 200 tokens; first within 20 ms at N = 6",
        Role.DECODE,
        Load(),
        6,
        Reason.SLA_NEEDS_MORE,
        itl_ms=19.986,
        traffic=Traffic(request_rate_per_s=100.0, isl_tokens=1000.0, osl_tokens=200.0),
    ),
    Row(
        "decode with only queued requests: each holds ISL = budget / 2 = 4096 tokens; 1.1 x (8 + 203.84/N): N = 21",
        Role.DECODE,
        Load(queued_decode=400),
        21,
        Reason.SLA_NEEDS_MORE,
        itl_ms=1.1 * (8 + 203.84 / 21),
    ),
    Row(
        "one queued decode request is load (not no_load): one replica meets the ITL",
        Role.DECODE,
        Load(queued_decode=1),
        1,
        Reason.SLA_ALLOWS_FEWER,
        itl_ms=1.1 * (8 + 0.1 + 0.4096),
    ),
    Row(
        "prefill past search_max: the TTFT reported is the one at search_max (T = 30k: 1.1 x 640)",
        Role.PREFILL,
        Load(queued_prefill=40_000),
        2,
        Reason.SLA_NEEDS_MORE,
        ttft_ms=704.0,
        current=1,
        search_max=2,
    ),
    Row(
        "aggregated without a step model: the ITL (8) and the TTFT (4) both checked, the larger wins",
        Role.AGG,
        Load(decode=400, kv=400_000, queued_prefill=40_000),
        8,
        Reason.SLA_NEEDS_MORE,
        ttft_ms=1.1 * (20 + 0.02 * 15_000),
        itl_ms=19.8,
    ),
    Row(
        "prefill: 4 x 10k queued tokens, ISL 10k; TTFT 1.1 x (ceil(T/8192) x 10 + 0.02 T), T = 10k + 40k/N: N = 4",
        Role.PREFILL,
        Load(queued_prefill=40_000),
        4,
        Reason.SLA_NEEDS_MORE,
        ttft_ms=473.0,
        current=2,
    ),
    Row(
        "prefill with traffic: 50 req/s of 2000 tokens, M/D/1 backlog; 90 ms first met at N = 4 (68.2; 3 gives 92.6)",
        Role.PREFILL,
        Load(),
        4,
        Reason.SLA_ALLOWS_FEWER,
        ttft_ms=68.2,
        current=6,
        sla=SlaTargets(ttft_ms=90.0, itl_ms=20.0),
        traffic=Traffic(request_rate_per_s=50.0, isl_tokens=2000.0, osl_tokens=100.0),
    ),
    Row(
        "prefill with traffic at a utilization >= 1 on fewer engines (2 gives 1.06): N = 3 at 500 ms",
        Role.PREFILL,
        Load(),
        3,
        Reason.SLA_NEEDS_MORE,
        ttft_ms=92.6,
        current=1,
        traffic=Traffic(request_rate_per_s=50.0, isl_tokens=2000.0, osl_tokens=100.0),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_recommend_sla(row: Row) -> None:
    rec = reconciled(row.role, 4, row.load)
    out = recommend_sla(
        row.role,
        row.current,
        rec,
        rec.load,
        row.traffic,
        AnalyticPerf(),
        row.sla,
        row.headroom_frac,
        row.search_max,
        itl_headroom_frac=row.itl_headroom_frac,
    )
    assert (out.replicas, out.reason, out.mode) == (row.expected, row.reason, Mode.SLA)
    assert out.predicted_ttft_ms == (None if row.ttft_ms is None else pytest.approx(row.ttft_ms, abs=0.05))
    assert out.predicted_itl_ms == (None if row.itl_ms is None else pytest.approx(row.itl_ms, abs=0.001))


def test_details_say_what_was_met() -> None:
    rec = reconciled(Role.DECODE, 4, DECODE_400)
    met = recommend_sla(Role.DECODE, 4, rec, rec.load, None, AnalyticPerf(), SlaTargets(itl_ms=20.0), 0.1, 64)
    assert met.detail == "10 replicas: ITL 17.6 ms <= 18.0"
    capped = recommend_sla(Role.DECODE, 4, rec, rec.load, None, AnalyticPerf(), SlaTargets(itl_ms=20.0), 0.0, 5)
    assert capped.detail == "more than 5 replicas needed"
    stuck = recommend_sla(Role.DECODE, 4, rec, rec.load, None, AnalyticPerf(), SlaTargets(itl_ms=8.0), 0.0, 64)
    assert stuck.detail == "even 64 replicas miss the SLA; holding at 4"
    idle = reconciled(Role.DECODE, 4, Load())
    none = recommend_sla(Role.DECODE, 4, idle, idle.load, None, AnalyticPerf(), SlaTargets(), 0.0, 64)
    assert none.detail == "no load and no traffic"


def test_an_engine_reporting_a_one_token_budget_is_taken_at_its_word() -> None:
    """Chunks of 1 token: 10 + 40/N chunks of 10 ms each; N = 2 is the first within 500 ms (1.1 x 300.6)."""
    capacity = EngineCapacity(max_num_batched_tokens=1, max_num_seqs=256, kv_capacity_tokens=100_000)
    rec = reconciled(Role.PREFILL, 4, Load(queued_prefill=40), capacity=capacity)
    out = recommend_sla(Role.PREFILL, 4, rec, rec.load, None, AnalyticPerf(), SLA, 0.0, 64)
    assert (out.replicas, out.reason) == (2, Reason.SLA_ALLOWS_FEWER)
    assert out.predicted_ttft_ms == pytest.approx(1.1 * 300.6)


class StepAnalytic(AnalyticPerf):
    """AnalyticPerf plus a mixed-step prediction (a StepPredictor): the decode step plus the prefill cost."""

    def predict_step_ms(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> LatencyEstimate:
        value = (
            self.decode_base_ms
            + decode_requests * self.decode_ms_per_request
            + decode_kv_tokens * self.decode_ms_per_kv_token
            + prefill_tokens * self.prefill_ms_per_token
            + prefill_kv_tokens * 0.000001
        )
        return LatencyEstimate(value_ms=value, upper_ms=value * (1.0 + self.band_frac))


@dataclass
class AggRow:
    name: str
    load: Load
    traffic: Traffic | None
    sla: SlaTargets


AGG_ROWS = [
    AggRow(
        "observed batch and queue, no traffic",
        Load(decode=300, kv=300_000, queued_prefill=8000, prefill=4000),
        None,
        SlaTargets(ttft_ms=400.0, itl_ms=25.0),
    ),
    AggRow(
        "traffic, nothing decoding yet",
        Load(),
        Traffic(request_rate_per_s=40.0, isl_tokens=1500.0, osl_tokens=150.0),
        SlaTargets(ttft_ms=300.0, itl_ms=30.0),
    ),
    AggRow(
        "traffic on top of a running batch",
        Load(decode=200, kv=150_000, queued_decode=40),
        Traffic(request_rate_per_s=20.0, isl_tokens=1000.0, osl_tokens=300.0),
        SlaTargets(ttft_ms=300.0, itl_ms=30.0),
    ),
]


@pytest.mark.parametrize("row", AGG_ROWS, ids=[r.name for r in AGG_ROWS])
def test_aggregated_with_a_step_model_is_the_fewest_engines_meeting_the_per_engine_prediction(row: AggRow) -> None:
    """The documented wiring: at N replicas each engine gets 1/N of the rate, of the decoding (running plus
    queued) and queued prefill, and of the scheduled prefill only without a rate; a sequence holds the observed KV
    per running request, or ISL + OSL / 2 when nothing decodes. The answer is the first N (scanned here) whose
    per-engine prediction meets both targets."""
    rec = reconciled(Role.AGG, 4, row.load)
    load, traffic = rec.load, row.traffic
    predictor = StepAnalytic()
    rate = traffic.request_rate_per_s if traffic is not None else None
    isl = traffic.isl_tokens if traffic is not None and traffic.isl_tokens else None
    osl = traffic.osl_tokens if traffic is not None and traffic.osl_tokens else None
    if isl is None:
        isl = (load.queued_prefill_tokens + load.scheduled_prefill_tokens) / rec.prefill_requests
    kv_per = load.decode_kv_tokens / load.decode_requests if load.decode_requests > 0 else isl + (osl or 0.0) / 2

    def meets(n: int) -> tuple[bool, AggLatency]:
        agg = predict_agg_latency(
            predictor,
            rate_per_s=(rate or 0.0) / n,
            isl_tokens=isl,
            osl_tokens=osl or 1.0,
            kv_per_request_tokens=kv_per,
            max_num_batched_tokens=8192,
            decode_requests=(load.decode_requests + load.queued_decode_requests) / n,
            queued_prefill_tokens=load.queued_prefill_tokens / n,
            scheduled_prefill_tokens=0.0 if rate else load.scheduled_prefill_tokens / n,
            max_num_seqs=256,
            kv_capacity_tokens=100_000,
        )
        return agg.ttft_ms <= row.sla.ttft_ms and agg.itl_ms <= row.sla.itl_ms, agg

    expected = next(n for n in range(1, 65) if meets(n)[0])
    assert expected > 1  # the row needs more than one replica: the per-engine division matters
    out = recommend_sla(Role.AGG, 4, rec, load, traffic, predictor, row.sla, 0.0, 64)
    _, agg = meets(expected)
    assert (out.replicas, out.predicted_ttft_ms, out.predicted_itl_ms) == (expected, agg.ttft_ms, agg.itl_ms)
