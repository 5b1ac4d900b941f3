"""Synthetic replay scenarios (issue 13, item 7): deterministic, shaped as named, and runnable from the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from planner.errors import ConfigError
from planner.sim.scenarios import SCENARIOS, scenario_trace

EXPECTED = {
    "surge_from_idle",
    "diurnal_ramp",
    "flash_crowd",
    "prompt_shift",
    "output_shift",
    "slow_drift",
    "bursty",
    "burst_train",
    "prefix_reuse",
}


def _rate(trace_arrivals: np.ndarray, lo: float, hi: float) -> float:
    return float(((trace_arrivals >= lo) & (trace_arrivals < hi)).sum()) / (hi - lo)


def test_every_scenario_the_issue_names_exists() -> None:
    assert set(SCENARIOS) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_scenario_is_the_same_for_the_same_seed_and_differs_for_another(name: str) -> None:
    a, b, c = scenario_trace(name, seed=3), scenario_trace(name, seed=3), scenario_trace(name, seed=4)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.isl, b.isl)
    np.testing.assert_array_equal(a.osl, b.osl)
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] == 0.0
    assert a.isl.min() >= 1 and a.osl.min() >= 1


def test_surge_from_idle_is_idle_then_a_surge() -> None:
    t = scenario_trace("surge_from_idle")  # times from its first request, a few seconds into the idle part
    assert t.arrival_s[1] > 1.0  # idle: requests seconds apart
    assert _rate(t.arrival_s, 0.0, 500.0) < 0.2 and 55.0 < _rate(t.arrival_s, 700.0, 1400.0) < 65.0
    assert _rate(t.arrival_s, 1600.0, 2000.0) < 0.2


def test_flash_crowd_is_ten_times_the_base_for_three_minutes() -> None:
    t = scenario_trace("flash_crowd")
    base = _rate(t.arrival_s, 100.0, 700.0)
    crowd = _rate(t.arrival_s, 730.0, 890.0)
    assert 9.0 < crowd / base < 11.0


def test_diurnal_ramp_rises_and_falls() -> None:
    t = scenario_trace("diurnal_ramp")
    edges = [_rate(t.arrival_s, lo, lo + 300.0) for lo in (0.0, 1650.0, 3300.0)]
    assert edges[0] < 10.0 and edges[1] > 50.0 and edges[2] < 10.0


def test_prompt_and_output_shifts_change_the_lengths_mid_trace() -> None:
    p = scenario_trace("prompt_shift")
    early, late = p.arrival_s < 850.0, p.arrival_s > 950.0
    assert np.median(p.isl[early]) < 400 and np.median(p.isl[late]) > 3000
    assert abs(np.median(p.osl[early]) / np.median(p.osl[late]) - 1) < 0.1
    o = scenario_trace("output_shift")
    early, late = o.arrival_s < 850.0, o.arrival_s > 950.0
    assert np.median(o.osl[early]) < 60 and np.median(o.osl[late]) > 450


def test_slow_drift_grows_the_rate_and_the_prompts() -> None:
    t = scenario_trace("slow_drift")
    first, last = t.arrival_s < 600.0, t.arrival_s > 3000.0
    assert _rate(t.arrival_s, 0.0, 600.0) < 0.6 * _rate(t.arrival_s, 3000.0, 3600.0)
    assert np.median(t.isl[first]) < 0.7 * np.median(t.isl[last])


def _dispersion_per_10_s(arrival_s: np.ndarray) -> tuple[float, int]:
    """Index of dispersion (variance / mean) of the request counts in whole 10 s bins, and the number of bins."""
    bins = int(arrival_s[-1] // 10.0)
    counts = np.bincount((arrival_s[arrival_s < 10.0 * bins] // 10.0).astype(np.int64), minlength=bins)
    return float(counts.var(ddof=1) / counts.mean()), bins


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["bursty", "burst_train"])
def test_bursty_is_burstier_than_poisson_and_a_constant_rate_scenario_is_not(seed: int, name: str) -> None:
    # For a Poisson process at a constant rate, (n - 1) * dispersion over n bins is about chi-square with n - 1
    # degrees of freedom: the dispersion is 1 with standard deviation sqrt(2 / (n - 1)). Six of those either side.
    bursty, n = _dispersion_per_10_s(scenario_trace(name, seed=seed).arrival_s)
    margin = 6.0 * math.sqrt(2.0 / (n - 1))
    assert n >= 150 and bursty > 1.0 + margin
    steady, m = _dispersion_per_10_s(scenario_trace("prompt_shift", seed=seed).arrival_s)  # 20 req/s throughout
    assert abs(steady - 1.0) < 6.0 * math.sqrt(2.0 / (m - 1))


def test_bursty_sits_at_its_base_rate_between_bursts_four_times_it_in_one() -> None:
    t = scenario_trace("bursty", seed=5)
    bins = int(t.arrival_s[-1] // 10.0)
    counts = np.bincount((t.arrival_s[t.arrival_s < 10.0 * bins] // 10.0).astype(np.int64), minlength=bins)
    assert 100 <= np.median(counts) <= 140  # 12 req/s most of the time (bursts are about a fifth of it)
    assert 400 <= np.percentile(counts, 97) <= 560  # 48 req/s inside a burst


def test_burst_train_sits_at_its_base_rate_between_bursts_three_times_it_in_one() -> None:
    t = scenario_trace("burst_train", seed=0)
    bins = int(t.arrival_s[-1] // 10.0)
    counts = np.bincount((t.arrival_s[t.arrival_s < 10.0 * bins] // 10.0).astype(np.int64), minlength=bins)
    assert 120 <= np.median(counts) <= 180  # 15 req/s most of the time at seed 0 (bursts are about a fifth of it)
    assert 380 <= np.percentile(counts, 97) <= 520  # 45 req/s inside a burst
    assert 1300 <= np.median(t.isl) <= 1700 and 170 <= np.median(t.osl) <= 230


def test_an_unknown_scenario_is_refused_with_the_known_names() -> None:
    with pytest.raises(ConfigError, match="flash_crowd"):
        scenario_trace("nope")


def test_replay_runs_a_scenario_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(
        [
            "replay",
            "--scenario",
            "output_shift",
            "--duration-s",
            "60",
            "--policy",
            "ours,fixed,oracle",
            "--startup-mode",
            "restore",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["trace"]["name"] == "scenario:output_shift"
    assert set(doc["policies"]) == {"ours", "fixed", "oracle"}
    assert doc["settings"]["fleet"]["startup_mode"] == "restore"


def test_replay_needs_exactly_one_of_trace_and_scenario(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--quiet"])
    with pytest.raises(SystemExit):
        main(["replay", "--scenario", "flash_crowd", "--trace", str(tmp_path / "t.csv"), "--quiet"])
    with pytest.raises(SystemExit):
        main(["replay", "--scenario", "no_such_scenario", "--quiet"])


def _reused_share(hash_ids: tuple[tuple[int, ...] | None, ...]) -> float:
    """The share of prompt blocks an infinite prefix cache would hit: each prompt's leading blocks seen before."""
    seen: set[int] = set()
    hit = total = 0
    for ids in hash_ids:
        assert ids is not None
        lead = next((k for k, block in enumerate(ids) if block not in seen), len(ids))
        hit += lead
        total += len(ids)
        seen.update(ids)
    return hit / total


def test_prefix_reuse_prompts_are_session_histories_an_infinite_cache_mostly_hits() -> None:
    t = scenario_trace("prefix_reuse", seed=2)
    again = scenario_trace("prefix_reuse", seed=2)
    assert t.hash_ids == again.hash_ids and t.hash_ids != scenario_trace("prefix_reuse", seed=3).hash_ids
    assert len(t) > 5000
    # a prompt is whole 512-token blocks of its session's history and then its own tokens, the last block partial
    firsts: dict[int, tuple[int, ...]] = {}
    for isl, ids in zip(t.isl.tolist(), t.hash_ids, strict=True):
        assert ids is not None and len(ids) == -(-isl // 512)
        firsts.setdefault(ids[0], ids)
    assert 5 <= len(firsts) <= 40  # the sessions seen; each history 16-31 blocks (8-16k tokens)
    assert 16 * 512 < float(np.median(t.isl)) < 32 * 512
    # histories repeat: an infinite cache would hit most prompt tokens (history ~24 blocks, own ~2)
    assert 0.8 < _reused_share(t.hash_ids) < 0.95
    # and no request's own blocks appear in another request
    own = [block for ids in t.hash_ids if ids is not None for block in ids if block >= 40 * 32]
    assert own and len(own) == len(set(own))
    # the rate: 4 req/s at the start, 16 when held, 8 at the end
    assert 3.0 < _rate(t.arrival_s, 0.0, 60.0) < 6.0 and 14.0 < _rate(t.arrival_s, 450.0, 600.0) < 18.0
    assert 7.0 < _rate(t.arrival_s, 860.0, 895.0) < 11.0


def test_other_scenarios_share_no_prefix() -> None:
    for name in EXPECTED - {"prefix_reuse"}:
        assert set(scenario_trace(name, seed=1).hash_ids) == {None}, name
