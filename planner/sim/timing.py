"""Step timing for simulated engines.

The simulator asks one question of a timing model: how long does an engine step take for this batch? That is
the :class:`StepTimer` protocol. :class:`ProfileFitTimer` answers it from the measured H200 profile
(``prefill.csv`` / ``decode.csv``) with a small least-squares fit, so the simulator runs without perf_model; when
perf_model's profile timer is importable, :func:`default_timer` uses it instead.

Model (seconds)::

    t = base + a_p * P + a_attn * P * (K + P / 2) + a_d * D + a_kv * KV

P prefill tokens computed this step, K prefill tokens already in cache (attention reads), D decode requests,
KV decode KV tokens. ``base``, ``a_d``, ``a_kv`` come from the decode profile (batch <= 512 points), ``a_p`` and
``a_attn`` from the prefill profile; the prefill profile's extra intercept (request overhead outside the step)
is reported as :attr:`ProfileFitTimer.ttft_overhead_s`.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Protocol

import numpy as np

from planner.errors import ConfigError

__all__ = ["DEFAULT_PROFILE_DIR", "ProfileFitTimer", "StepTimer", "default_timer", "ttft_overhead_s"]

DEFAULT_PROFILE_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"
_DEFAULT_KV_CAPACITY_TOKENS = 945029


class StepTimer(Protocol):
    def step_time_s(
        self, prefill_tokens: int, prefill_kv_tokens: int, decode_requests: int, decode_kv_tokens: int
    ) -> float:
        """Duration of one engine step with this batch, in seconds (> 0)."""
        ...


class ProfileFitTimer:
    """Linear step-time model fitted on a measured profile directory (see module docstring)."""

    __slots__ = ("a_attn", "a_d", "a_kv", "a_p", "base_s", "kv_capacity_tokens", "ttft_overhead_s")

    def __init__(
        self,
        *,
        base_s: float,
        a_p: float,
        a_attn: float,
        a_d: float,
        a_kv: float,
        ttft_overhead_s: float = 0.0,
        kv_capacity_tokens: int = _DEFAULT_KV_CAPACITY_TOKENS,
    ) -> None:
        for name, value in (("base_s", base_s), ("a_p", a_p), ("a_attn", a_attn), ("a_d", a_d), ("a_kv", a_kv)):
            if not value >= 0:
                raise ConfigError(f"step timer coefficient {name} must be >= 0, got {value}")
        if base_s <= 0:
            raise ConfigError("step timer base_s must be > 0")
        self.base_s = base_s
        self.a_p = a_p
        self.a_attn = a_attn
        self.a_d = a_d
        self.a_kv = a_kv
        self.ttft_overhead_s = max(0.0, ttft_overhead_s)
        self.kv_capacity_tokens = kv_capacity_tokens

    @classmethod
    def from_dir(
        cls, path: str | Path = DEFAULT_PROFILE_DIR, *, kv_capacity_tokens: int = _DEFAULT_KV_CAPACITY_TOKENS
    ) -> ProfileFitTimer:
        root = Path(path)
        try:
            prefill = _read_csv(root / "prefill.csv", ("isl_tokens", "ttft_ms"))
            decode = _read_csv(root / "decode.csv", ("kv_usage_fraction", "context_length_tokens", "itl_ms"))
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"cannot read profile {root}: {exc}") from exc
        isl = prefill[:, 0]
        ttft_s = prefill[:, 1] / 1000.0
        xp = np.column_stack([np.ones_like(isl), isl, isl * isl / 2.0])
        cp = _nnls(xp, ttft_s)
        kv = decode[:, 0] * kv_capacity_tokens
        batch = kv / decode[:, 1]
        keep = batch <= 512  # beyond max_num_seqs-sized batches the profile saturates
        xd = np.column_stack([np.ones(int(keep.sum())), batch[keep], kv[keep]])
        cd = _nnls(xd, decode[keep, 2] / 1000.0)
        base = float(cd[0])
        return cls(
            base_s=base,
            a_p=float(cp[1]),
            a_attn=float(cp[2]),
            a_d=float(cd[1]),
            a_kv=float(cd[2]),
            ttft_overhead_s=float(cp[0]) - base,
            kv_capacity_tokens=kv_capacity_tokens,
        )

    def step_time_s(
        self, prefill_tokens: int, prefill_kv_tokens: int, decode_requests: int, decode_kv_tokens: int
    ) -> float:
        return (
            self.base_s
            + self.a_p * prefill_tokens
            + self.a_attn * prefill_tokens * (prefill_kv_tokens + 0.5 * prefill_tokens)
            + self.a_d * decode_requests
            + self.a_kv * decode_kv_tokens
        )


def _read_csv(path: Path, columns: tuple[str, ...]) -> np.ndarray:
    with path.open(newline="") as fh:
        rows = [[float(row[c]) for c in columns] for row in csv.DictReader(fh)]
    if len(rows) < len(columns) + 1:
        raise ValueError(f"{path.name}: too few rows ({len(rows)})")
    return np.asarray(rows, dtype=float)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients clipped at zero (refit without the clipped columns)."""
    active = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        coef[:] = 0.0
        coef[active] = sol
        if (coef >= 0).all():
            break
        active &= coef > 0
    return np.maximum(coef, 0.0)


def default_timer(profile_dir: str | Path = DEFAULT_PROFILE_DIR) -> StepTimer:
    """perf_model's profile step timer when it is available, else :class:`ProfileFitTimer` on the same profile."""
    try:
        from perf_model import ProfileStepTimer
    except ImportError:
        return ProfileFitTimer.from_dir(profile_dir)
    timer: StepTimer = ProfileStepTimer.from_dir(profile_dir)
    return timer


def ttft_overhead_s(timer: StepTimer) -> float:
    """Request-path time in a measured TTFT that is in no engine step, when the timer knows it (seconds)."""
    seconds = getattr(timer, "ttft_overhead_s", None)
    if isinstance(seconds, int | float):
        return max(0.0, float(seconds))
    ms = getattr(timer, "ttft_overhead_ms", None)
    if isinstance(ms, int | float):
        return max(0.0, float(ms) / 1000.0)
    return 0.0
