from __future__ import annotations

import math

import pytest

from perf_model.samples import CoverageStore, Sample, SampleFilter, SampleVerdict
from planner.discovery import Role
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests, heartbeat


def step(
    counter: int, *, worker: str = "w0", p: int = 0, b: int = 4, k: int = 4000, wall_s: float = 0.01
) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        counter_id=counter,
        wall_time=wall_s,
        scheduled_requests=ScheduledRequests(sum_prefill_tokens=p, num_decode_requests=b, sum_decode_kv_tokens=k),
    )


def test_first_steps_of_each_engine_are_warmup_and_heartbeats_do_not_count() -> None:
    f = SampleFilter(Role.DECODE, warmup_steps=3)
    verdicts = [f.check(step(1)), f.check(heartbeat("w0", 0, 2)), f.check(step(3)), f.check(step(4))]
    assert verdicts == [
        SampleVerdict.WARMUP,
        SampleVerdict.HEARTBEAT,
        SampleVerdict.WARMUP,
        SampleVerdict.WARMUP,
    ]
    assert f.check(step(5)) is SampleVerdict.ACCEPTED
    # Another engine has its own warm-up.
    assert f.check(step(1, worker="w1")) is SampleVerdict.WARMUP


def test_a_counter_that_goes_back_is_a_restart_and_warms_up_again() -> None:
    f = SampleFilter(Role.DECODE, warmup_steps=2)
    for counter in range(1, 5):
        f.check(step(counter))
    assert f.check(step(5)) is SampleVerdict.ACCEPTED
    assert f.check(step(1)) is SampleVerdict.WARMUP  # restarted
    assert f.check(step(2)) is SampleVerdict.WARMUP
    assert f.check(step(3)) is SampleVerdict.ACCEPTED


@pytest.mark.parametrize(
    ("name", "role", "sample", "verdict"),
    [
        ("negative wall time", Role.DECODE, step(10, wall_s=-1.0), SampleVerdict.INVALID),
        ("NaN wall time", Role.DECODE, step(10, wall_s=math.nan), SampleVerdict.INVALID),
        ("negative batch", Role.DECODE, step(10, b=-1), SampleVerdict.INVALID),
        ("time spent on nothing", Role.AGG, step(10, b=0, k=0), SampleVerdict.INVALID),
        ("prefill work on a decode engine", Role.DECODE, step(10, p=100), SampleVerdict.WRONG_ROLE),
        ("decode work on a prefill engine", Role.PREFILL, step(10, p=100, b=2), SampleVerdict.WRONG_ROLE),
        ("mixed step on an aggregated engine", Role.AGG, step(10, p=100, b=2), SampleVerdict.ACCEPTED),
    ],
)
def test_verdicts(name: str, role: Role, sample: ForwardPassMetrics, verdict: SampleVerdict) -> None:
    f = SampleFilter(role, warmup_steps=0)
    assert f.check(sample) is verdict, name


def test_outlier_is_far_either_way() -> None:
    f = SampleFilter(Role.DECODE, outlier_factor=3.0)
    assert not f.check_outlier(29.0, 10.0)
    assert f.check_outlier(31.0, 10.0)
    assert f.check_outlier(3.0, 10.0)


def sample(b: float, at: float) -> Sample:
    return Sample(load=(0.0, 0.0, b, b * 1000.0), wall_time_ms=10.0, at=at)


def test_store_is_bounded_and_a_burst_at_one_load_keeps_the_rest_of_the_range() -> None:
    store = CoverageStore(Role.DECODE, max_samples=100, per_bin=50)
    for i, b in enumerate((1, 4, 16, 64, 256)):
        for j in range(10):
            store.add(sample(b, at=float(i * 10 + j)))
    for j in range(10_000):  # a long stretch at one load level
        store.add(sample(8, at=1000.0 + j))
    assert len(store) <= 100
    batches = {s.load[2] for s in store}
    assert batches == {1, 4, 8, 16, 64, 256}
    # The burst's bin holds its newest samples.
    burst = sorted(s.at for s in store if s.load[2] == 8)
    assert burst[-1] == 1000.0 + 9_999


def test_store_evicts_from_the_fullest_bin_when_over_capacity() -> None:
    store = CoverageStore(Role.DECODE, max_samples=30, per_bin=1000)
    for j in range(25):
        store.add(sample(8, at=float(j)))
    for j in range(10):
        store.add(sample(512, at=100.0 + j))
    assert len(store) == 30
    assert sum(1 for s in store if s.load[2] == 512) == 10
