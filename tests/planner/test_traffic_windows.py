"""planner.ingest.traffic: per-service sliding windows of the FPM traffic extension, read with ``now``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core import CoreConfig, RoleConfig, SlaTargets, Traffic
from planner.discovery import Role
from planner.ingest.traffic import Merged, TrafficWindows, attainment, quantile, role_traffic
from worker_shim.fpm import StepTraffic
from worker_shim.metrics import TrafficAccumulator


def _step(
    arrivals: list[int] = (), ttft_ms: list[float] = (), completions: list[tuple[int, float | None]] = ()
) -> StepTraffic:  # type: ignore[assignment]
    acc = TrafficAccumulator()
    for n in arrivals:
        acc.arrival(n)
    for t in ttft_ms:
        acc.first_token(t)
    for n, itl in completions:
        acc.completion(n, itl)
    return acc.take()


def _merged(values: np.ndarray) -> Merged:
    acc = TrafficAccumulator()
    for v in values.tolist():
        acc.first_token(v)
    m = Merged()
    m.add(acc.take().ttft_ms)
    return m


def test_a_service_that_never_sent_the_extension_is_unknown_not_zero() -> None:
    windows = TrafficWindows(window_s=10.0)
    assert windows.traffic("decode", 5.0) is None
    windows.add("decode", StepTraffic(), 1.0)  # the extension, empty: nothing happened
    got = windows.traffic("decode", 5.0)
    assert got is not None and got.request_rate_per_s == 0.0 and got.requests_in_window == 0
    assert got.isl_tokens is None and got.isl_tokens_p90 is None and got.ttft_attainment_frac is None


def test_rate_counts_arrivals_over_the_window_and_old_seconds_leave_it() -> None:
    windows = TrafficWindows(window_s=10.0)
    for second in range(30):
        windows.add("agg", _step(arrivals=[100] * 4), second + 0.5)  # 4 requests/s
    got = windows.traffic("agg", 30.0)
    assert got is not None and got.window_s == 10.0 and got.requests_in_window == 40
    assert got.request_rate_per_s == pytest.approx(4.0)
    windows.add("agg", _step(arrivals=[100] * 40), 30.5)  # a burst
    got = windows.traffic("agg", 31.0)
    assert got is not None and got.requests_in_window == 36 + 40  # seconds 21..30 of the 10 s window
    later = windows.traffic("agg", 100.0)
    assert later is not None and later.requests_in_window == 0 and later.request_rate_per_s == 0.0


def test_while_the_window_fills_the_rate_divides_by_the_time_since_the_first_sample() -> None:
    windows = TrafficWindows(window_s=60.0)
    windows.add("agg", _step(arrivals=[10] * 5), 100.0)
    windows.add("agg", _step(arrivals=[10] * 5), 104.0)
    got = windows.traffic("agg", 105.0)
    assert got is not None and got.window_s == pytest.approx(5.0) and got.request_rate_per_s == pytest.approx(2.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_and_attainment_from_the_buckets_match_the_values(seed: int) -> None:
    values = np.random.default_rng(seed).lognormal(6.0, 1.0, 5000)
    hist = _merged(values)
    for q in (0.5, 0.9, 0.99):
        got = quantile(hist, q)
        assert got is not None and abs(got / float(np.quantile(values, q)) - 1) < 0.03
    for target in (100.0, 400.0, 2000.0):
        got_frac = attainment(hist, target)
        assert got_frac is not None and abs(got_frac - float((values <= target).mean())) < 0.01


def test_one_value_repeated_reads_back_exactly() -> None:
    hist = _merged(np.full(100, 1234.0))
    assert quantile(hist, 0.5) == quantile(hist, 0.99) == 1234.0
    assert attainment(hist, 2000.0) == 1.0 and attainment(hist, 1000.0) == 0.0
    assert quantile(Merged(), 0.5) is None and attainment(Merged(), 1.0) is None


def test_latency_and_attainment_against_the_targets() -> None:
    windows = TrafficWindows(window_s=30.0)
    windows.add("agg", _step(arrivals=[500, 1500], ttft_ms=[100.0, 3000.0]), 1.0)
    windows.add("agg", _step(completions=[(200, 20.0), (300, 80.0), (1, None)]), 2.0)
    got = windows.traffic("agg", 3.0, ttft_target_ms=2000.0, itl_target_ms=50.0)
    assert got is not None
    assert got.isl_tokens == 1000.0 and got.osl_tokens == pytest.approx(501 / 3)
    assert got.ttft_attainment_frac == 0.5 and got.itl_attainment_frac == 0.5
    assert got.ttft_samples_in_window == 2 and got.itl_samples_in_window == 2
    assert got.ttft_ms_p99 is not None and 2800 < got.ttft_ms_p99 <= 3000 * 2 ** (1 / 16)
    assert windows.traffic("agg", 3.0).ttft_attainment_frac is None  # type: ignore[union-attr]  # no target


def test_role_traffic_takes_each_roles_service_and_sla() -> None:
    windows = TrafficWindows(window_s=30.0)
    windows.add("svc-prefill", _step(arrivals=[100], ttft_ms=[900.0]), 1.0)
    config = CoreConfig(roles={Role.PREFILL: RoleConfig(sla=SlaTargets(ttft_ms=500, itl_ms=20))})
    got = role_traffic(windows, {Role.PREFILL: "svc-prefill", Role.DECODE: "svc-decode"}, 2.0, config)
    assert set(got) == {Role.PREFILL}  # the decode service sent nothing: unknown
    assert got[Role.PREFILL].ttft_attainment_frac == 0.0
    windows.forget(["svc-decode"])
    assert windows.services() == ()


def test_traffic_clean_treats_nonsense_as_unknown() -> None:
    bad = Traffic(
        isl_tokens_p90=math.nan,
        ttft_ms_p99=-1.0,
        ttft_attainment_frac=1.5,
        itl_attainment_frac=math.inf,
        requests_in_window=-3,
        window_s=math.inf,
        itl_ms_p50=12.0,
    )
    assert bad.clean() == Traffic(itl_ms_p50=12.0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        TrafficWindows(window_s=0.0)


def test_the_store_feeds_only_stored_step_samples_under_their_workers_service() -> None:
    from planner.discovery import WorkerRecord
    from planner.ingest.store import DropReason, FleetStore
    from worker_shim.fpm import ForwardPassMetrics, heartbeat

    store = FleetStore(ttl_s=30.0)
    windows = TrafficWindows(window_s=60.0)
    store.traffic = windows
    store.set_workers(
        {"w1": WorkerRecord(worker_id="w1", role=Role.DECODE, service="decode-svc", fpm_endpoints=("tcp://a:1",))}
    )

    def sample(counter: int, worker_id: str = "w1") -> ForwardPassMetrics:
        return ForwardPassMetrics(
            worker_id=worker_id, dp_rank=0, counter_id=counter, wall_time=0.01, traffic=_step(arrivals=[100, 200])
        )

    assert store.ingest("tcp://a:1", sample(1), 1.0, 1.0) is None
    assert store.ingest("tcp://a:1", sample(1), 1.1, 1.1) is DropReason.OUT_OF_ORDER  # a replay: not counted again
    assert store.ingest("tcp://a:1", sample(2, "stranger"), 1.2, 1.2) is DropReason.UNKNOWN_WORKER
    assert store.ingest("tcp://a:1", heartbeat("w1", 0, 3), 1.3, 1.3) is None
    got = windows.traffic("decode-svc", 2.0)
    assert windows.services() == ("decode-svc",)
    assert got is not None and got.requests_in_window == 2 and got.isl_tokens == 150.0


def test_a_shorter_read_window_counts_only_its_seconds_and_never_more_than_is_kept() -> None:
    windows = TrafficWindows(window_s=20.0)
    for second in range(30):
        windows.add("agg", _step(arrivals=[100] * (10 if second >= 25 else 2)), second + 0.5)
    now = 30.0
    kept = windows.traffic("agg", now)
    short = windows.traffic("agg", now, window_s=5.0)
    longer = windows.traffic("agg", now, window_s=600.0)
    assert kept is not None and short is not None and longer is not None
    assert kept.window_s == 20.0 and kept.requests_in_window == 15 * 2 + 5 * 10
    assert short.window_s == 5.0 and short.requests_in_window == 50
    assert short.request_rate_per_s == pytest.approx(10.0)
    assert longer == kept  # a window longer than the one kept reads what is kept
    with pytest.raises(ValueError, match="window_s"):
        windows.traffic("agg", now, window_s=0.0)


def test_role_traffic_reads_each_role_over_its_own_window() -> None:
    """A role's traffic_window_s is honoured even when another role keeps the windows longer (before, the
    windows' longest span was read for every role, so lowering one role's window did nothing)."""
    config = CoreConfig(
        roles={Role.PREFILL: RoleConfig(traffic_window_s=5.0), Role.DECODE: RoleConfig(traffic_window_s=20.0)}
    )
    windows = TrafficWindows(window_s=config.traffic_window_s)
    assert windows.window_s == 20.0
    for second in range(30):
        step = _step(arrivals=[100] * (10 if second >= 25 else 2))
        windows.add("svc-prefill", step, second + 0.5)
        windows.add("svc-decode", step, second + 0.5)
    got = role_traffic(windows, {Role.PREFILL: "svc-prefill", Role.DECODE: "svc-decode"}, 30.0, config)
    assert got[Role.PREFILL].window_s == 5.0 and got[Role.PREFILL].request_rate_per_s == pytest.approx(10.0)
    assert got[Role.DECODE].window_s == 20.0 and got[Role.DECODE].request_rate_per_s == pytest.approx(4.0)
