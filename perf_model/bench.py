"""``fpm-planner bench perf-model``: accuracy and speed of the perf model on a measured profile.

For each engine role (prefill, decode, aggregated): FPM samples of steps timed by the profile's
:class:`~perf_model.step_timer.ProfileStepTimer` with realistic noise (see :mod:`perf_model.synthetic`) train a
:class:`~perf_model.model.PerfModel` bootstrapped from the same profile; held-out steps and the profile's own
TTFT and ITL points are then predicted. Headline figures are the worst role's:

- ``step_time_mape``: mean |predicted - observed| / observed on held-out noisy steps (target <= 0.05);
- ``ttft_profile_err``: mean relative error on the profile's TTFT points, prefill and aggregated (<= 0.10);
- ``itl_profile_err``: the same on the profile's ITL points, decode and aggregated (<= 0.10).

Prints one JSON line with ``--json``, else a short table and the JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from perf_model.synthetic import synthetic_loads, timed_samples
from planner.discovery import Role

__all__ = ["add_arguments", "measure", "run"]

DEFAULT_PROFILE = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"
)
TARGETS = {"step_time_mape": 0.05, "ttft_profile_err": 0.10, "itl_profile_err": 0.10}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="measured profile directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-samples", type=int, default=4000, help="FPM samples per role to learn from")
    parser.add_argument("--test-samples", type=int, default=2000, help="held-out steps per role")
    parser.add_argument("--noise-frac", type=float, default=0.02, help="log-normal step-time jitter (sigma)")
    parser.add_argument("--outlier-frac", type=float, default=0.01, help="share of 1.5x..4x slow steps")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")


def _mean_rel(pred: list[float], ref: list[float]) -> tuple[float, float]:
    p = np.asarray(pred)
    r = np.asarray(ref)
    rel = np.abs(p - r) / r
    return float(np.mean(rel)), float(np.max(rel))


def _role_figures(
    timer: ProfileStepTimer, role: Role, args: argparse.Namespace, rng: np.random.Generator
) -> dict[str, Any]:
    chunk = args.max_num_batched_tokens
    kv = float(timer.max_kv_tokens or 945029)
    train = timed_samples(
        timer,
        synthetic_loads(role, args.train_samples, rng, max_num_batched_tokens=chunk, max_kv_tokens=kv),
        rng,
        noise_frac=args.noise_frac,
        outlier_frac=args.outlier_frac,
    )
    model = PerfModel(role, bootstrap=timer)
    # Online, as in the planner: a fit after the first half (live from then on, judging outliers), then another.
    half = len(train) // 2
    started = time.perf_counter()
    for sample in train[:half]:
        model.observe(sample, now=0.0)
    observe_s = time.perf_counter() - started
    model.refit(now=0.0)
    started = time.perf_counter()
    for sample in train[half:]:
        model.observe(sample, now=60.0)
    observe_us = (observe_s + time.perf_counter() - started) / len(train) * 1e6
    started = time.perf_counter()
    model.refit(now=60.0)
    refit_ms = (time.perf_counter() - started) * 1e3
    status = model.status()

    test_loads = synthetic_loads(role, args.test_samples, rng, max_num_batched_tokens=chunk, max_kv_tokens=kv)
    test = timed_samples(timer, test_loads, rng, noise_frac=args.noise_frac, outlier_frac=0.0, cold_steps=0)
    started = time.perf_counter()
    pred = [model.predict_step_ms(*load).value_ms for load in test_loads]
    predict_us = (time.perf_counter() - started) / len(test_loads) * 1e6
    mape, mape_max = _mean_rel(pred, [s.wall_time * 1000.0 for s in test])
    truth_mape, _ = _mean_rel(pred, [timer.step_time_ms(*load) for load in test_loads])
    figures: dict[str, Any] = {
        "source": str(status.source),
        "step_time_mape": round(mape, 4),
        "step_time_mape_vs_noise_free": round(truth_mape, 4),
        "step_time_max_err": round(mape_max, 4),
        "band_ratio": round(status.fit.band_ratio, 4) if status.fit else None,
        "coef_ms": dict(zip(status.fit.columns, status.fit.coef_ms, strict=True)) if status.fit else None,
        "samples_kept": status.samples,
        "trimmed": status.fit.trimmed if status.fit else None,
        "verdicts": {str(k): v for k, v in status.verdicts.items() if v},
        "observe_us": round(observe_us, 2),
        "refit_ms": round(refit_ms, 2),
        "predict_step_us": round(predict_us, 2),
    }
    if role is not Role.DECODE:
        points = timer.profile.prefill
        big = max(chunk, int(max(p.isl_tokens for p in points)))  # the profile prefilled each ISL in one step
        err, err_max = _mean_rel(
            [model.predict_ttft_ms(p.isl_tokens, 0.0, big).value_ms for p in points], [p.ttft_ms for p in points]
        )
        figures["ttft_profile_err"] = round(err, 4)
        figures["ttft_profile_max_err"] = round(err_max, 4)
    if role is not Role.PREFILL:
        dec = timer.profile.decode
        err, err_max = _mean_rel(
            [model.predict_itl_ms(d.decode_requests, d.decode_kv_tokens).value_ms for d in dec],
            [d.itl_ms for d in dec],
        )
        figures["itl_profile_err"] = round(err, 4)
        figures["itl_profile_max_err"] = round(err_max, 4)
    return figures


def measure(args: argparse.Namespace) -> dict[str, Any]:
    timer = ProfileStepTimer.from_dir(args.profile)
    rng = np.random.default_rng(args.seed)
    roles = {str(role): _role_figures(timer, role, args, rng) for role in Role}

    loads = synthetic_loads(Role.AGG, 20_000, rng)
    started = time.perf_counter()
    for p, pkv, b, k in loads:
        timer.step_time_s(p, pkv, b, k)
    step_timer_us = (time.perf_counter() - started) / len(loads) * 1e6

    result: dict[str, Any] = {
        "bench": "perf-model",
        "profile": timer.params.profile,
        "seed": args.seed,
        "train_samples": args.train_samples,
        "test_samples": args.test_samples,
        "noise_frac": args.noise_frac,
        "step_time_mape": max(r["step_time_mape"] for r in roles.values()),
        "ttft_profile_err": max(r["ttft_profile_err"] for r in roles.values() if "ttft_profile_err" in r),
        "itl_profile_err": max(r["itl_profile_err"] for r in roles.values() if "itl_profile_err" in r),
        "targets": TARGETS,
        "step_timer_call_us": round(step_timer_us, 3),
        "step_timer": {
            "base_ms": round(timer.params.base_ms, 4),
            "ttft_overhead_ms": round(timer.params.ttft_overhead_ms, 4),
        },
        "roles": roles,
    }
    result["within_targets"] = all(result[name] <= limit for name, limit in TARGETS.items())
    return result


def run(args: argparse.Namespace) -> int:
    result = measure(args)
    if not args.json:
        for role, figures in result["roles"].items():
            cells = [
                f"{k}={figures[k]}" for k in ("step_time_mape", "ttft_profile_err", "itl_profile_err") if k in figures
            ]
            print(f"{role:8s} " + "  ".join(cells))
    print(json.dumps(result, sort_keys=True))
    return 0
