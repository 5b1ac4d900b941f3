"""SLA mode on aggregated engines: the predicted ITL / TTFT of an engine running prefill chunks and decodes in the
same steps, against the simulated vLLM engine (planner.sim.engine, timed by the measured H200 profile) serving
the same Poisson load. The old prediction (decode-only step for ITL) is several times too low under load; these
tests fail on it."""

from __future__ import annotations

import math
import random

import pytest

from perf_model.api import StepPredictor
from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core.config import CoreConfigError, RoleConfig, SlaTargets, load_config
from planner.core.decision import Mode, Reason
from planner.core.observation import RoleLoad, Traffic
from planner.core.recommend import AggLatency, predict_agg_latency, recommend_sla
from planner.core.reconcile import Reconciled
from planner.discovery import Role
from planner.sim.engine import EngineConfig, SimEngine, SimRequest
from tests.core.fleetkit import H200_PROFILE, reconciled

ENGINE = EngineConfig(prefix_cache=False)  # 2048-token budget, 256 sequences, 945,029 KV tokens
BAND = 1.1  # PerfModel's band around a bootstrap profile (bootstrap_band_frac 0.10)


@pytest.fixture(scope="module")
def timer() -> ProfileStepTimer:
    return ProfileStepTimer.from_dir(H200_PROFILE)


@pytest.fixture(scope="module")
def model(timer: ProfileStepTimer) -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=timer)


def simulate(timer: ProfileStepTimer, rate_per_s: float, isl: int, osl: int, duration_s: float) -> tuple[float, float]:
    """Mean ITL and mean TTFT (ms) of one simulated engine under Poisson arrivals, requests arriving in the
    first 20 % of the run excluded (warm-up)."""
    rng = random.Random(11)
    arrivals: list[float] = []
    at = rng.expovariate(rate_per_s)
    while at < duration_s:
        arrivals.append(at)
        at += rng.expovariate(rate_per_s)
    engine = SimEngine("w0", ENGINE, timer)
    done: list[SimRequest] = []
    now, i = 0.0, 0
    while True:
        while i < len(arrivals) and arrivals[i] <= now:
            engine.add(SimRequest(i, arrivals[i], isl, osl))
            i += 1
        end = engine.begin_step(now)
        if end is None:
            if i >= len(arrivals):
                break
            now = arrivals[i]
            continue
        done += engine.end_step(end)
        now = end
    kept = [r for r in done if r.arrival_s >= 0.2 * duration_s]
    itl = [r.itl_s for r in kept if r.itl_s is not None]
    ttft = [r.ttft_s for r in kept if r.ttft_s is not None]
    return 1000.0 * sum(itl) / len(itl), 1000.0 * sum(ttft) / len(ttft)


# (requests/s per engine, ISL, OSL): light to heavy prefill share, short and long prompts.
CASES = [
    (1.0, 2000, 200),
    (8.0, 2000, 200),
    (12.0, 2000, 200),
    (5.0, 2000, 600),
    (1.0, 8000, 150),
    (2.5, 8000, 150),
    (3.5, 8000, 150),
    (1.0, 15000, 150),
    (1.8, 15000, 150),
    (2.0, 15000, 150),
]


def predict_on_engine(model: PerfModel, rate: float, isl: int, osl: int) -> AggLatency:
    """The aggregated-role prediction with every limit of the simulated engine (``ENGINE``)."""
    return predict_agg_latency(
        model,
        rate_per_s=rate,
        isl_tokens=isl,
        osl_tokens=osl,
        kv_per_request_tokens=isl + osl / 2,
        max_num_batched_tokens=ENGINE.max_num_batched_tokens,
        max_num_seqs=ENGINE.max_num_seqs,
        kv_capacity_tokens=ENGINE.kv_capacity_tokens,
    )


@pytest.mark.parametrize(("rate", "isl", "osl"), CASES)
def test_mixed_step_itl_matches_the_simulated_engine(
    timer: ProfileStepTimer, model: PerfModel, rate: float, isl: int, osl: int
) -> None:
    measured_itl_ms, _ = simulate(timer, rate, isl, osl, duration_s=240.0)
    agg = predict_on_engine(model, rate, isl, osl)
    assert agg.saturated == ""
    predicted_ms = agg.itl_ms / BAND  # central estimate
    assert predicted_ms == pytest.approx(measured_itl_ms, rel=0.25), (predicted_ms, measured_itl_ms)
    if agg.prefill_busy_frac >= 0.4:
        # Where prefill chunks fill a good share of the engine's time, the decode-only step the core used
        # before is far below what the engine runs.
        decode_only_ms = model.predict_itl_ms(agg.decode_batch, agg.decode_batch * (isl + osl / 2)).value_ms
        assert decode_only_ms < 0.75 * measured_itl_ms, (decode_only_ms, measured_itl_ms)


TTFT_CASES = [(1.0, 2000, 200), (1.0, 8000, 150), (2.5, 8000, 150), (1.8, 15000, 150)]


@pytest.mark.parametrize(("rate", "isl", "osl"), TTFT_CASES)
def test_mixed_ttft_is_within_the_simulated_engine_range(
    timer: ProfileStepTimer, model: PerfModel, rate: float, isl: int, osl: int
) -> None:
    _, measured_ttft_ms = simulate(timer, rate, isl, osl, duration_s=240.0)
    agg = predict_agg_latency(
        model,
        rate_per_s=rate,
        isl_tokens=isl,
        osl_tokens=osl,
        kv_per_request_tokens=isl + osl / 2,
        max_num_batched_tokens=ENGINE.max_num_batched_tokens,
    )
    predicted_ms = agg.ttft_ms / BAND
    assert predicted_ms == pytest.approx(measured_ttft_ms, rel=0.35), (predicted_ms, measured_ttft_ms)


def test_saturated_engine_is_infinite_with_the_limit_named(model: PerfModel) -> None:
    # 8 requests/s of 8k tokens is ~64k prefill tokens/s: more than one engine's 2048-token steps can do.
    agg = predict_agg_latency(
        model,
        rate_per_s=8.0,
        isl_tokens=8000,
        osl_tokens=150,
        kv_per_request_tokens=8075,
        max_num_batched_tokens=2048,
    )
    assert math.isinf(agg.itl_ms) and math.isinf(agg.ttft_ms)
    assert agg.saturated == "engine time"
    seqs = predict_agg_latency(
        model,
        rate_per_s=4.0,
        isl_tokens=100,
        osl_tokens=2000,
        kv_per_request_tokens=1100,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
    )
    assert seqs.saturated == "max_num_seqs"


def test_no_rate_uses_the_observed_batch(model: PerfModel) -> None:
    agg = predict_agg_latency(
        model,
        rate_per_s=0.0,
        isl_tokens=2000,
        osl_tokens=200,
        kv_per_request_tokens=2100,
        max_num_batched_tokens=2048,
        decode_requests=40,
        scheduled_prefill_tokens=1000,
    )
    assert agg.decode_batch == 40
    assert agg.itl_ms == pytest.approx(model.predict_step_ms(1000, 0, 40, 40 * 2100).upper_ms)
    # More decodes, or more KV each, than the engine holds: saturated, whatever the rate.
    full = predict_agg_latency(
        model,
        rate_per_s=0.0,
        isl_tokens=2000,
        osl_tokens=200,
        kv_per_request_tokens=2100,
        max_num_batched_tokens=2048,
        decode_requests=300,
        max_num_seqs=256,
    )
    assert full.saturated == "max_num_seqs" and math.isinf(full.itl_ms)


def _reconciled(engines: int) -> Reconciled:
    return reconciled(
        Role.AGG,
        engines,
        prefill_requests=0.0,
        max_num_batched_tokens=float(ENGINE.max_num_batched_tokens),
        max_num_seqs=float(ENGINE.max_num_seqs),
        kv_capacity_tokens=float(ENGINE.kv_capacity_tokens),
    )


# (fleet requests/s, ISL, OSL): the recommended count, simulated one engine at rate / N, meets ITL 50 ms.
FLEET_CASES = [(120.0, 2000, 200), (35.0, 8000, 150), (20.0, 15000, 150)]


@pytest.mark.parametrize(("rate", "isl", "osl"), FLEET_CASES)
def test_recommended_agg_replicas_meet_itl_in_the_simulated_engine(
    timer: ProfileStepTimer, model: PerfModel, rate: float, isl: int, osl: int
) -> None:
    assert isinstance(model, StepPredictor)
    rec = recommend_sla(
        Role.AGG,
        4,
        _reconciled(4),
        RoleLoad(),
        Traffic(request_rate_per_s=rate, isl_tokens=isl, osl_tokens=osl),
        model,
        SlaTargets(ttft_ms=2000, itl_ms=50),
        0.0,
        256,
    )
    assert rec.mode is Mode.SLA and rec.reason in (Reason.SLA_NEEDS_MORE, Reason.SLA_ALLOWS_FEWER, Reason.SLA_MET)
    itl_ms, ttft_ms = simulate(timer, rate / rec.replicas, isl, osl, duration_s=240.0)
    assert itl_ms <= 50.0 and ttft_ms <= 2000.0, (rec.replicas, itl_ms, ttft_ms)
    assert rec.predicted_itl_ms is not None and rec.predicted_itl_ms <= 50.0
    # Not grossly over-provisioned either: one replica fewer misses the ITL target in the prediction.
    if rec.replicas > 1:
        fewer = predict_on_engine(model, rate / (rec.replicas - 1), isl, osl)
        assert fewer.itl_ms > 50.0 or fewer.ttft_ms > 2000.0


def test_itl_headroom_tightens_only_the_itl_check(model: PerfModel) -> None:
    traffic = Traffic(request_rate_per_s=35.0, isl_tokens=8000, osl_tokens=150)
    sla = SlaTargets(ttft_ms=2000, itl_ms=50)
    base = recommend_sla(Role.AGG, 4, _reconciled(4), RoleLoad(), traffic, model, sla, 0.0, 256)
    tight = recommend_sla(Role.AGG, 4, _reconciled(4), RoleLoad(), traffic, model, sla, 0.0, 256, itl_headroom_frac=0.6)
    assert tight.replicas > base.replicas
    assert tight.predicted_itl_ms is not None and tight.predicted_itl_ms <= 0.4 * 50
    # The same margin given to both checks (headroom_frac) also caps TTFT at 40 % of its target.
    both = recommend_sla(Role.AGG, 4, _reconciled(4), RoleLoad(), traffic, model, sla, 0.6, 256)
    assert both.predicted_ttft_ms is not None and both.predicted_ttft_ms <= 0.4 * 2000
    assert both.replicas >= tight.replicas


def test_itl_headroom_is_validated() -> None:
    with pytest.raises(CoreConfigError, match="itl_headroom_frac"):
        RoleConfig(itl_headroom_frac=1.0)
    with pytest.raises(CoreConfigError, match="itl_headroom_frac"):
        load_config({"roles": {"agg": {"itl_headroom_frac": -0.1}}})
    assert RoleConfig(itl_headroom_frac=0.5).itl_headroom_frac == 0.5
