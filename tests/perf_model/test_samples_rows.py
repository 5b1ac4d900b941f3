"""The perf model's sample filter row by row (the mutation run showed its edges untested): which verdict each
sample gets, warm-up counting per source across restarts and heartbeats, and the outlier band's edges."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from perf_model.features import valid_load
from perf_model.samples import CoverageStore, Sample, SampleFilter, SampleVerdict, load_bins
from planner.discovery import Role
from planner.errors import ConfigError
from worker_shim.fpm import ForwardPassMetrics, ScheduledRequests


def step(
    counter: int, *, wall_time: float = 0.02, prefill: int = 0, decode: int = 0, kv: int = 0, worker: str = "w"
) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        worker_id=worker,
        dp_rank=0,
        counter_id=counter,
        wall_time=wall_time,
        scheduled_requests=ScheduledRequests(
            num_prefill_requests=1 if prefill else 0,
            sum_prefill_tokens=prefill,
            num_decode_requests=decode,
            sum_decode_kv_tokens=kv,
        ),
    )


@dataclass
class Row:
    name: str
    role: Role
    sample: ForwardPassMetrics
    verdict: SampleVerdict


ROWS = [
    Row("a decode step on a decode engine is accepted", Role.DECODE, step(5, decode=1, kv=10), SampleVerdict.ACCEPTED),
    Row("a prefill step on a prefill engine is accepted", Role.PREFILL, step(5, prefill=1), SampleVerdict.ACCEPTED),
    Row(
        "a mixed step on an aggregated engine is accepted",
        Role.AGG,
        step(5, prefill=9, decode=1),
        SampleVerdict.ACCEPTED,
    ),
    Row(
        "one decode on a prefill engine is the wrong role",
        Role.PREFILL,
        step(5, prefill=9, decode=1),
        SampleVerdict.WRONG_ROLE,
    ),
    Row(
        "one prefill token on a decode engine is the wrong role",
        Role.DECODE,
        step(5, prefill=1, decode=4),
        SampleVerdict.WRONG_ROLE,
    ),
    Row("a step that scheduled nothing yet took time is invalid", Role.AGG, step(5), SampleVerdict.INVALID),
    Row(
        "a step that only read KV (no token computed) is invalid",
        Role.AGG,
        ForwardPassMetrics(
            worker_id="w",
            dp_rank=0,
            counter_id=5,
            wall_time=0.02,
            scheduled_requests=ScheduledRequests(sum_prefill_kv_tokens=64),
        ),
        SampleVerdict.INVALID,
    ),
    Row(
        "a step with work but no wall time is invalid",
        Role.DECODE,
        step(5, wall_time=0.0, decode=1),
        SampleVerdict.INVALID,
    ),
    Row("a negative wall time is invalid", Role.DECODE, step(5, wall_time=-0.01, decode=1), SampleVerdict.INVALID),
    Row("an infinite wall time is invalid", Role.DECODE, step(5, wall_time=math.inf, decode=1), SampleVerdict.INVALID),
    Row("a negative count is invalid", Role.DECODE, step(5, decode=1, kv=-1), SampleVerdict.INVALID),
    Row("a heartbeat is a heartbeat", Role.DECODE, step(5, wall_time=0.0), SampleVerdict.HEARTBEAT),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_verdicts_after_warm_up(row: Row) -> None:
    f = SampleFilter(row.role, warmup_steps=0)
    assert f.check(row.sample) is row.verdict


def test_warm_up_counts_step_samples_per_source_and_restarts_with_the_counter() -> None:
    f = SampleFilter(Role.DECODE, warmup_steps=2)
    verdicts = [f.check(step(c, decode=1)) for c in (1, 2, 3, 4)]
    assert verdicts == [SampleVerdict.WARMUP, SampleVerdict.WARMUP, SampleVerdict.ACCEPTED, SampleVerdict.ACCEPTED]
    assert f.check(step(5, wall_time=0.0)) is SampleVerdict.HEARTBEAT  # heartbeats move the counter, not the count
    assert f.check(step(6, decode=1)) is SampleVerdict.ACCEPTED
    assert f.check(step(6, decode=1)) is SampleVerdict.WARMUP  # the same counter again: a restart
    assert f.check(step(1, decode=1, worker="other")) is SampleVerdict.WARMUP  # another source warms up on its own
    assert f.check(step(7, decode=1)) is SampleVerdict.WARMUP
    assert f.check(step(8, decode=1)) is SampleVerdict.ACCEPTED
    f.forget("w", 0)
    assert f.check(step(9, decode=1)) is SampleVerdict.WARMUP  # forgotten: warms up again


@pytest.mark.parametrize(
    ("observed_ms", "predicted_ms", "outlier"),
    [
        (30.0, 10.0, False),  # exactly 3x: still in
        (30.01, 10.0, True),
        (1.0, 3.0, False),  # exactly 1/3: still in
        (3.33, 10.0, True),
        (10.0, 10.0, False),
        (100.0, 0.0, False),  # no prediction to compare with
        (0.5, 0.5, False),
        (2.0, 0.5, True),
    ],
)
def test_outliers_are_more_than_the_factor_away_either_way(
    observed_ms: float, predicted_ms: float, outlier: bool
) -> None:
    assert SampleFilter(Role.DECODE, outlier_factor=3.0).check_outlier(observed_ms, predicted_ms) is outlier


@pytest.mark.parametrize(("warmup", "factor"), [(-1, 3.0), (0, 1.0), (0, 0.5), (0, math.nan)])
def test_nonsense_settings_are_refused(warmup: int, factor: float) -> None:
    with pytest.raises(ConfigError, match="need warmup_steps >= 0 and outlier_factor > 1"):
        SampleFilter(Role.DECODE, warmup_steps=warmup, outlier_factor=factor)


@pytest.mark.parametrize(
    ("load", "valid"),
    [
        ((0.0, 0.0, 0.0, 0.0), True),
        ((1.0, 2.0, 3.0, 4.0), True),
        ((-1.0, 0.0, 0.0, 0.0), False),
        ((0.0, math.nan, 0.0, 0.0), False),
        ((0.0, 0.0, math.inf, 0.0), False),
    ],
)
def test_valid_load(load: tuple[float, float, float, float], valid: bool) -> None:
    assert valid_load(load) is valid


def sample_at(load: tuple[float, float, float, float], at: float) -> Sample:
    return Sample(load=load, wall_time_ms=10.0, at=at)


@pytest.mark.parametrize(
    ("role", "load", "bins"),
    [
        (Role.PREFILL, (0.0, 3.0, 9.0, 9.0), (0, 4)),  # int(2 log2(1 + x)): 0 -> 0, 3 -> 4
        (Role.DECODE, (9.0, 9.0, 1.0, 15.0), (2, 8)),
        (Role.AGG, (7.0, 0.0, 1.0, 255.0), (6, 2, 16)),
    ],
)
def test_load_bins_are_half_octaves_of_the_roles_terms(
    role: Role, load: tuple[float, float, float, float], bins: tuple[int, ...]
) -> None:
    assert load_bins(role, load) == bins


def test_the_coverage_store_caps_each_bin_and_the_total() -> None:
    store = CoverageStore(Role.DECODE, max_samples=5, per_bin=2)
    small, large, huge = (0.0, 0.0, 1.0, 10.0), (0.0, 0.0, 100.0, 10_000.0), (0.0, 0.0, 1000.0, 10**6)
    for at in (1.0, 2.0, 3.0):
        store.add(sample_at(small, at))  # the bin keeps its 2 newest
    assert (len(store), store.bins, store.added) == (2, 1, 3)
    assert [s.at for s in store] == [2.0, 3.0]
    for at in (4.0, 5.0):
        store.add(sample_at(large, at))
    store.add(sample_at(huge, 6.0))
    assert (len(store), store.bins, store.added) == (5, 3, 6)
    store.add(sample_at(huge, 7.0))  # 6 > 5: a fullest bin (2 each) gives up its oldest sample, the oldest bin's
    assert (len(store), store.added) == (5, 7)
    assert sorted(s.at for s in store) == [3.0, 4.0, 5.0, 6.0, 7.0]
    store.clear()
    assert (len(store), store.bins, list(store)) == (0, 0, [])


def test_defaults_and_refused_settings() -> None:
    store = CoverageStore(Role.DECODE)
    assert (store.max_samples, store.per_bin, store.added, store.role) == (4096, 64, 0, Role.DECODE)
    assert CoverageStore(Role.DECODE, max_samples=1, per_bin=1).per_bin == 1
    for max_samples, per_bin in ((0, 1), (1, 0)):
        with pytest.raises(ConfigError, match=f"need max_samples >= 1 and per_bin >= 1, got {max_samples}, {per_bin}"):
            CoverageStore(Role.DECODE, max_samples=max_samples, per_bin=per_bin)
    f = SampleFilter(Role.DECODE)
    assert (f.warmup_steps, f.outlier_factor) == (16, 3.0)
    assert SampleFilter(Role.DECODE, outlier_factor=1.5).outlier_factor == 1.5
