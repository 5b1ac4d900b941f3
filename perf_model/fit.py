"""Fitting step time to samples: :func:`fit_step_time`, a robust non-negative least-squares fit in relative error,
with a greedy choice of hinge columns where the data bend (:func:`_choose_hinges`), giving a
:class:`StepTimeFit`. Pure: no state, no clock."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np
from sklearn.linear_model import LinearRegression

from perf_model.errors import InvalidLoadError
from perf_model.features import COLUMNS, HINGE_VARIABLES, Hinge, StepLoad, feature_row, hinge_name
from planner.discovery import Role

__all__ = ["StepTimeFit", "fit_step_time"]


class StepTimeFit(msgspec.Struct, frozen=True, kw_only=True):
    """A fitted step-time model: ``step_ms = sum(coef * feature)``, every coefficient >= 0."""

    role: Role
    columns: tuple[str, ...]
    coef_ms: tuple[float, ...]
    band_ratio: float  # quantile of observed/predicted on the kept samples, >= 1
    samples: int  # used in the final fit
    trimmed: int  # dropped as residual outliers
    mape: float  # mean |observed - predicted| / observed on the kept samples
    hinges: tuple[Hinge, ...] = ()  # hinge columns the fit chose (after the role's COLUMNS), see perf_model.features

    def step_ms(self, load: StepLoad) -> float:
        row = feature_row(self.role, load, self.hinges)
        return max(0.0, sum(c * x for c, x in zip(self.coef_ms, row, strict=True)))


_HINGE_QUANTILES = (0.2, 0.4, 0.6, 0.8)
_MAX_HINGES = 2
_SELECT_SAMPLES = 512
_HINGE_GAIN = 0.15  # a hinge is kept when it cuts the robust relative error by at least this fraction


def _robust_error(x: np.ndarray, y: np.ndarray) -> float:
    """Mean relative error (each capped at 0.5, so stray slow steps do not choose the shape) of a non-negative
    least-squares fit in relative error."""
    reg = LinearRegression(positive=True, fit_intercept=False)
    reg.fit(x, y, sample_weight=1.0 / y**2)
    rel = np.abs(y - np.maximum(x @ reg.coef_, 1e-9)) / y
    return float(np.mean(np.minimum(rel, 0.5)))


def _choose_hinges(role: Role, loads: Sequence[StepLoad], y: np.ndarray) -> tuple[Hinge, ...]:
    """Greedy forward selection of at most two hinge columns (knots at the 20/40/60/80 % quantiles of each of the
    role's hinge variables), each kept only when it cuts the robust relative error by 15 %: a linear engine keeps
    its linear features; a launch-bound floor or a kink in the attention cost gets a bend where the data show it."""
    if len(loads) > _SELECT_SAMPLES:  # choose on an even subsample: the shape, not the noise, decides
        step = len(loads) / _SELECT_SAMPLES
        picks = [int(i * step) for i in range(_SELECT_SAMPLES)]
        loads = [loads[i] for i in picks]
        y = y[picks]
    arr = np.asarray(loads, dtype=float)
    candidates: list[Hinge] = []
    for index in HINGE_VARIABLES[role]:
        values = arr[:, index][arr[:, index] > 0]
        if len(values) < 8:
            continue
        knots = sorted({float(np.quantile(values, q)) for q in _HINGE_QUANTILES})
        candidates.extend((index, knot) for knot in knots if knot > 0)
    chosen: tuple[Hinge, ...] = ()

    def design(hinges: tuple[Hinge, ...]) -> np.ndarray:
        raw = np.asarray([feature_row(role, load, hinges) for load in loads], dtype=float)
        scale = np.max(np.abs(raw), axis=0)
        scale[scale == 0.0] = 1.0
        scaled: np.ndarray = raw / scale
        return scaled

    best = _robust_error(design(chosen), y)
    for _ in range(_MAX_HINGES):
        trials = [(_robust_error(design((*chosen, h)), y), h) for h in candidates if h not in chosen]
        if not trials:
            break
        err, hinge = min(trials)
        if err > best * (1.0 - _HINGE_GAIN):
            break
        chosen, best = (*chosen, hinge), err
    return chosen


def fit_step_time(
    role: Role,
    loads: Sequence[StepLoad],
    wall_ms: Sequence[float],
    *,
    band_quantile: float = 0.9,
    trim_mads: float = 4.0,
    shape: bool = True,
) -> StepTimeFit:
    """Non-negative least squares in relative error (``sample_weight = 1/y^2``), trimmed once for robustness.

    Non-negative because every feature is a cost (more tokens never make a step faster), which also keeps
    predictions monotone in load and never negative; relative error because step times span three orders of
    magnitude and the SLA cares about ratios. A first fit finds residual outliers (beyond ``trim_mads`` median
    absolute deviations of the relative residual), which are dropped before the final fit.

    ``shape``: let the fit add hinge columns where the data bend (:func:`_choose_hinges`; a launch-bound floor,
    a kink in attention cost). Off, the role's linear columns only."""
    if len(loads) != len(wall_ms) or len(loads) < 2:
        raise InvalidLoadError(
            f"need at least two (load, wall_ms) pairs of equal length, got {len(loads)} and {len(wall_ms)}"
        )
    if not all(math.isfinite(w) and w > 0 for w in wall_ms):
        raise InvalidLoadError("every wall_ms must be finite and positive")
    y_all = np.asarray(wall_ms, dtype=float)
    hinges = _choose_hinges(role, loads, y_all) if shape else ()
    raw = np.asarray([feature_row(role, load, hinges) for load in loads], dtype=float)
    # Columns span 1 to ~1e9 (attention terms): scale each to at most 1 so the solver is well conditioned.
    scale = np.max(np.abs(raw), axis=0)
    scale[scale == 0.0] = 1.0
    x = raw / scale
    y = np.asarray(wall_ms, dtype=float)
    keep = np.ones(len(y), dtype=bool)
    reg = LinearRegression(positive=True, fit_intercept=False)
    for _ in range(2):
        reg.fit(x[keep], y[keep], sample_weight=1.0 / y[keep] ** 2)
        rel = (y - np.maximum(x @ reg.coef_, 1e-9)) / y
        med = float(np.median(rel[keep]))
        mad = float(np.median(np.abs(rel[keep] - med))) * 1.4826
        new_keep = np.abs(rel - med) <= max(trim_mads * mad, 1e-6)
        if new_keep.sum() < 2 or np.array_equal(new_keep, keep):
            break
        keep = new_keep
    coef = np.maximum(reg.coef_, 0.0)
    pred = np.maximum(x[keep] @ coef, 1e-9)
    coef = coef / scale
    ratio = y[keep] / pred
    return StepTimeFit(
        role=role,
        columns=COLUMNS[role] + tuple(hinge_name(h) for h in hinges),
        coef_ms=tuple(float(c) for c in coef),
        band_ratio=max(1.0, float(np.quantile(ratio, band_quantile))),
        samples=int(keep.sum()),
        trimmed=int((~keep).sum()),
        mape=float(np.mean(np.abs(1.0 - 1.0 / ratio))),
        hinges=hinges,
    )
