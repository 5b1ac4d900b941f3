"""Rows for ``fpm-planner bench perf-model`` (issue 15, the survivors of perf_model/bench.py): the JSON line's keys
(sorted), the arguments it echoes, its units and rounding (accuracy figures to 4 decimals, speeds in µs / ms to 2,
the step timer's call to 3, docs/benchmarks.md), a maximum error never below its mean, held-out steps that carry
only the jitter (no slow or cold steps), the table printed without ``--json``, and the help of the noise flags."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from perf_model.step_timer import ProfileStepTimer
from planner.cli import main

SMALL = ["--train-samples", "800", "--test-samples", "300"]
ACCURACY = ("step_time_mape", "step_time_mape_vs_noise_free", "step_time_max_err", "band_ratio")
SPEEDS = ("observe_us", "refit_ms", "predict_step_us")
COMMON = {"source", "coef_ms", "samples_kept", "trimmed", "verdicts", *ACCURACY, *SPEEDS}
TTFT = {"ttft_profile_err", "ttft_profile_max_err"}
ITL = {"itl_profile_err", "itl_profile_max_err"}


def _bench(profile: Path, *extra: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "perf-model", "--profile", str(profile), *SMALL, *extra]) == 0
    return out.getvalue().strip().splitlines()


def _json(profile: Path, *extra: str) -> dict[str, Any]:
    lines = _bench(profile, "--json", *extra)
    assert len(lines) == 1
    result: dict[str, Any] = json.loads(lines[0])
    assert lines[0] == json.dumps(result, sort_keys=True)  # keys sorted: one stable line to diff
    return result


def _rounded(value: Any, digits: int) -> bool:
    return isinstance(value, float) and value == round(value, digits)


def test_json_keys_and_echoed_arguments(h200_dir: Path) -> None:
    result = _json(h200_dir, "--seed", "2", "--noise-frac", "0.03")
    assert set(result) == {
        "bench",
        "profile",
        "seed",
        "train_samples",
        "test_samples",
        "noise_frac",
        "step_time_mape",
        "ttft_profile_err",
        "itl_profile_err",
        "targets",
        "step_timer_call_us",
        "step_timer",
        "roles",
        "within_targets",
    }
    assert result["bench"] == "perf-model" and result["profile"] == "h200_llama31_8b_fp8_tp1"
    assert (result["seed"], result["train_samples"], result["test_samples"]) == (2, 800, 300)
    assert isinstance(result["noise_frac"], float) and result["noise_frac"] == 0.03
    assert result["targets"] == {"step_time_mape": 0.05, "ttft_profile_err": 0.10, "itl_profile_err": 0.10}
    assert set(result["step_timer"]) == {"base_ms", "ttft_overhead_ms"}
    roles = result["roles"]
    assert set(roles["prefill"]) == COMMON | TTFT
    assert set(roles["decode"]) == COMMON | ITL
    assert set(roles["agg"]) == COMMON | TTFT | ITL


def test_figures_are_rounded_as_documented(h200_dir: Path, h200_timer: ProfileStepTimer) -> None:
    result = _json(h200_dir, "--seed", "3")
    for role, figures in result["roles"].items():
        assert figures["source"] == "live", role
        for name in (*ACCURACY, *(TTFT | ITL)):
            if name in figures:
                assert _rounded(figures[name], 4), (role, name, figures[name])
        for name in SPEEDS:
            assert _rounded(figures[name], 2) and figures[name] > 0, (role, name, figures[name])
        assert isinstance(figures["trimmed"], int) and 0 <= figures["trimmed"] <= 800  # the live fit's
        assert "one" in figures["coef_ms"]
        assert figures["coef_ms"] and all(isinstance(v, float) for v in figures["coef_ms"].values())
    for name in ("step_time_mape", "ttft_profile_err", "itl_profile_err"):  # the worst role's
        assert result[name] == max(f[name] for f in result["roles"].values() if name in f)
    assert _rounded(result["step_timer_call_us"], 3) and result["step_timer_call_us"] > 0
    assert result["step_timer"] == {
        "base_ms": round(h200_timer.params.base_ms, 4),
        "ttft_overhead_ms": round(h200_timer.params.ttft_overhead_ms, 4),
    }


def test_a_maximum_error_is_between_its_mean_and_its_sum(h200_dir: Path, h200_timer: ProfileStepTimer) -> None:
    roles = _json(h200_dir, "--seed", "4")["roles"]
    points = {"ttft": len(h200_timer.profile.prefill), "itl": len(h200_timer.profile.decode)}
    for role, figures in roles.items():
        for kind, n in points.items():
            if f"{kind}_profile_err" in figures:
                mean, top = figures[f"{kind}_profile_err"], figures[f"{kind}_profile_max_err"]
                assert 0 < mean <= top <= n * mean + n * 5e-5, (role, kind, mean, top)
        assert figures["step_time_mape"] <= figures["step_time_max_err"]


def test_held_out_steps_carry_only_the_jitter(h200_dir: Path) -> None:
    # No outliers and no cold steps among the held-out steps: without jitter they are the timer's own times.
    roles = _json(h200_dir, "--seed", "5", "--noise-frac", "0")["roles"]
    for role, figures in roles.items():
        assert figures["step_time_mape"] == figures["step_time_mape_vs_noise_free"], role


def test_table_without_json(h200_dir: Path) -> None:
    lines = _bench(h200_dir, "--seed", "6")
    assert len(lines) == 4
    table = {line.split()[0]: line for line in lines[:3]}
    result = json.loads(lines[3])
    for role, keys in {
        "prefill": ("step_time_mape", "ttft_profile_err"),
        "decode": ("step_time_mape", "itl_profile_err"),
        "agg": ("step_time_mape", "ttft_profile_err", "itl_profile_err"),
    }.items():
        assert table[role].split()[1:] == [f"{k}={result['roles'][role][k]}" for k in keys]


def test_help_names_the_noise_units(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "perf-model", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--noise-frac NOISE_FRAC log-normal step-time jitter (sigma)" in text
    assert "--outlier-frac OUTLIER_FRAC share of 1.5x..4x slow steps" in text
