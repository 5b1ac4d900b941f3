"""Engine step timing calibrated on a measured profile: how long one vLLM engine step takes for a given batch.

The fleet simulator times every simulated engine step with :meth:`ProfileStepTimer.step_time_s`, so the call
is pure Python float arithmetic (two or three bisections, no numpy, no allocation): a few microseconds.

Model (all terms in ms; see ``docs/perf_model.md``)::

    step = base                                   engine step floor (decode of one sequence)
         + prefill(P)                             P tokens computed, measured shape of the TTFT curve
         + attn * P * Pkv                         attention of those tokens over Pkv tokens already cached
         + decode(B, K)                           B sequences decoding, K tokens of KV cache among them

* ``base`` and the decode terms come from ``decode.csv``: a non-negative fit ``itl = base + g*B + k*K`` gives
  the smooth shape, and the measured points are honoured exactly by adding, per measured context length, the
  residual interpolated linearly in B (and linearly between the two nearest context lengths). The measured ITL
  of each context length is made non-decreasing in B first, so the timer is monotone in load.
* The prefill terms come from ``prefill.csv``: a non-negative fit ``ttft = c0 + a*isl + q*isl^2``. Its
  intercept above ``base`` is request-path time that no engine step contains (HTTP, tokenization, first-token
  streaming): :attr:`ProfileStepTimer.ttft_overhead_ms`. A prefill-only step of P tokens is interpolated
  linearly through ``(0, base)`` and the measured ``(isl, ttft - ttft_overhead_ms)`` points (made
  non-decreasing). The quadratic term is attention: ``q*isl^2 = attn * isl * isl/2``, so ``attn = 2q`` prices
  the context a chunk reads.
* Outside the measured range the fitted shape carries on from the last measured point (the residual is held at
  its edge value), so times keep growing at the fitted slope instead of flattening or exploding.

A step that schedules nothing takes 0 s (the engine does not run one).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

from perf_model.errors import InvalidLoadError, ProfileError
from perf_model.profile import MeasuredProfile, load_profile

__all__ = ["ProfileStepTimer", "StepTimerParams"]


class StepTimerParams(msgspec.Struct, frozen=True, kw_only=True):
    """The smooth part of a :class:`ProfileStepTimer`, for status pages and docs."""

    profile: str
    base_ms: float  # engine step floor
    ttft_overhead_ms: float  # request-path time in a measured TTFT that is in no engine step
    prefill_ms_per_token: float  # a
    attention_ms_per_token_pair: float  # attn = 2q
    decode_ms_per_request: float  # g
    decode_ms_per_kv_token: float  # k
    max_kv_tokens: int | None
    max_measured_isl_tokens: float
    max_measured_decode_requests: float
    max_measured_decode_kv_tokens: float


def _nonneg_lstsq(columns: Sequence[Sequence[float]], target: Sequence[float]) -> tuple[float, ...]:
    """Least squares in relative error with every coefficient >= 0: tries each subset of columns (few columns,
    so exhaustively) and keeps the best feasible one. Pure numpy; used once at construction."""
    x = np.asarray(columns, dtype=float).T
    y = np.asarray(target, dtype=float)
    weight = 1.0 / y
    xw = x * weight[:, None]
    yw = y * weight
    n = x.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            coef, *_ = np.linalg.lstsq(xw[:, subset], yw, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(n)
            full[list(subset)] = coef
            err = float(np.sum((xw @ full - yw) ** 2))
            if best is None or err < best[0]:
                best = (err, full)
    if best is None:  # unreachable: a single non-negative column always fits with coef >= 0 for y > 0
        raise ProfileError("no non-negative fit of the profile")
    return tuple(float(c) for c in best[1])


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear interpolation, held constant outside ``[xs[0], xs[-1]]``."""
    i = bisect_right(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        return ys[-1]
    x0 = xs[i - 1]
    x1 = xs[i]
    y0 = ys[i - 1]
    return y0 + (ys[i] - y0) * (x - x0) / (x1 - x0)


def _running_max(values: Sequence[float]) -> list[float]:
    out: list[float] = []
    top = -math.inf
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


class ProfileStepTimer:
    """Step time of one engine as a function of its batch, calibrated on a :class:`MeasuredProfile`.

    Construct with :meth:`from_dir` (a profile directory) or :meth:`from_profile`. Immutable after
    construction; safe to share between threads and simulated engines.
    """

    __slots__ = (
        "_decode_levels",
        "_level_b",
        "_level_resid",
        "_prefill_ms",
        "_prefill_tokens",
        "attn_ms",
        "base_ms",
        "dec_b_ms",
        "dec_k_ms",
        "params",
        "pref_a_ms",
        "pref_q_ms",
        "profile",
        "ttft_overhead_ms",
    )

    def __init__(self, profile: MeasuredProfile) -> None:
        if not profile.prefill or not profile.decode:
            raise ProfileError(f"profile {profile.name}: needs prefill and decode points")
        self.profile = profile

        # Decode: itl = base + g*B + k*K (non-negative, relative least squares).
        dec = profile.decode
        base, g, k = _nonneg_lstsq(
            [[1.0] * len(dec), [d.decode_requests for d in dec], [d.decode_kv_tokens for d in dec]],
            [d.itl_ms for d in dec],
        )
        self.base_ms = base
        self.dec_b_ms = g
        self.dec_k_ms = k
        levels: list[float] = []
        level_b: list[list[float]] = []
        level_resid: list[list[float]] = []
        for ctx, group in itertools.groupby(dec, key=lambda d: d.context_length_tokens):
            points = sorted(group, key=lambda d: d.decode_requests)
            itl = _running_max([p.itl_ms for p in points])
            bs = [p.decode_requests for p in points]
            # Collapse equal batches (np-style interp needs strictly increasing x): keep the larger time.
            xs: list[float] = []
            rs: list[float] = []
            for b, t in zip(bs, itl, strict=True):
                resid = t - (base + g * b + k * b * ctx)
                if xs and b <= xs[-1]:
                    rs[-1] = max(rs[-1], resid)
                    continue
                xs.append(b)
                rs.append(resid)
            levels.append(ctx)
            level_b.append(xs)
            level_resid.append(rs)
        self._decode_levels = levels
        self._level_b = level_b
        self._level_resid = level_resid

        # Prefill: ttft = c0 + a*isl + q*isl^2; c0 - base is request-path overhead in no engine step.
        pre = profile.prefill
        c0, a, q = _nonneg_lstsq(
            [[1.0] * len(pre), [p.isl_tokens for p in pre], [p.isl_tokens**2 for p in pre]],
            [p.ttft_ms for p in pre],
        )
        self.ttft_overhead_ms = max(0.0, c0 - base)
        self.pref_a_ms = a
        self.pref_q_ms = q
        self.attn_ms = 2.0 * q
        knots_x = [0.0] + [p.isl_tokens for p in pre]
        knots_y = _running_max([base] + [max(base, p.ttft_ms - self.ttft_overhead_ms) for p in pre])
        self._prefill_tokens = knots_x
        self._prefill_ms = knots_y  # prefill-only step time, base included

        self.params = StepTimerParams(
            profile=profile.name,
            base_ms=base,
            ttft_overhead_ms=self.ttft_overhead_ms,
            prefill_ms_per_token=a,
            attention_ms_per_token_pair=self.attn_ms,
            decode_ms_per_request=g,
            decode_ms_per_kv_token=k,
            max_kv_tokens=profile.max_kv_tokens,
            max_measured_isl_tokens=knots_x[-1],
            max_measured_decode_requests=max(d.decode_requests for d in dec),
            max_measured_decode_kv_tokens=max(d.decode_kv_tokens for d in dec),
        )

    @classmethod
    def from_profile(cls, profile: MeasuredProfile) -> ProfileStepTimer:
        return cls(profile)

    @classmethod
    def from_dir(cls, path: str | Path, *, max_kv_tokens: int | None = None) -> ProfileStepTimer:
        """Load ``prefill.csv``/``decode.csv`` (and ``README.md``'s ``max_kv_tokens``) from ``path``."""
        return cls(load_profile(path, max_kv_tokens=max_kv_tokens))

    @property
    def max_kv_tokens(self) -> int | None:
        """The profiled engine's KV-cache capacity in tokens, when the profile names it."""
        return self.profile.max_kv_tokens

    # -- components (ms) ----------------------------------------------------------------------------------

    def prefill_only_ms(self, prefill_tokens: float) -> float:
        """Step time of a prefill-only step of ``prefill_tokens`` with nothing cached, base included."""
        xs = self._prefill_tokens
        if prefill_tokens <= xs[-1]:
            return _interp(prefill_tokens, xs, self._prefill_ms)
        last = xs[-1]
        a = self.pref_a_ms
        q = self.pref_q_ms
        return self._prefill_ms[-1] + a * (prefill_tokens - last) + q * (prefill_tokens**2 - last * last)

    def decode_only_ms(self, decode_requests: float, decode_kv_tokens: float) -> float:
        """Step time of a decode-only step, base included."""
        b = decode_requests
        smooth = self.base_ms + self.dec_b_ms * b + self.dec_k_ms * decode_kv_tokens
        ctx = decode_kv_tokens / b if b > 0 else 0.0
        levels = self._decode_levels
        i = bisect_right(levels, ctx)
        if i == 0:
            resid = _interp(b, self._level_b[0], self._level_resid[0])
        elif i == len(levels):
            resid = _interp(b, self._level_b[-1], self._level_resid[-1])
        else:
            lo = _interp(b, self._level_b[i - 1], self._level_resid[i - 1])
            hi = _interp(b, self._level_b[i], self._level_resid[i])
            c0 = levels[i - 1]
            resid = lo + (hi - lo) * (ctx - c0) / (levels[i] - c0)
        return max(self.base_ms, smooth + resid)

    # -- the simulator's entry point ----------------------------------------------------------------------

    def step_time_ms(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> float:
        """Duration in ms of one engine step. Arguments are FPM ``scheduled_requests`` fields:
        ``sum_prefill_tokens``, ``sum_prefill_kv_tokens``, ``num_decode_requests``, ``sum_decode_kv_tokens``.
        Raises :class:`~perf_model.errors.InvalidLoadError` for a negative or non-finite argument."""
        if not (
            0.0 <= prefill_tokens < math.inf
            and 0.0 <= prefill_kv_tokens < math.inf
            and 0.0 <= decode_requests < math.inf
            and 0.0 <= decode_kv_tokens < math.inf
        ):
            raise InvalidLoadError(
                f"step load must be finite and non-negative: prefill_tokens={prefill_tokens}, "
                f"prefill_kv_tokens={prefill_kv_tokens}, decode_requests={decode_requests}, "
                f"decode_kv_tokens={decode_kv_tokens}"
            )
        total = 0.0
        base = self.base_ms
        if prefill_tokens > 0.0:
            total += self.prefill_only_ms(prefill_tokens) - base + self.attn_ms * prefill_tokens * prefill_kv_tokens
        if decode_requests > 0.0:
            total += self.decode_only_ms(decode_requests, decode_kv_tokens) - base
        elif prefill_tokens <= 0.0:
            return 0.0
        return total + base

    def step_time_s(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> float:
        """Duration in seconds of one engine step (see :meth:`step_time_ms`); 0.0 when nothing is
        scheduled."""
        return self.step_time_ms(prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens) / 1000.0

    def ttft_ms(self, isl_tokens: float, max_num_batched_tokens: int) -> float:
        """TTFT of one request alone on an idle engine, prefilled in chunks of ``max_num_batched_tokens``,
        plus :attr:`ttft_overhead_ms`. Reproduces the profile's TTFT points when the chunk covers the ISL."""
        if max_num_batched_tokens < 1:
            raise InvalidLoadError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        if not 0.0 <= isl_tokens < math.inf:
            raise InvalidLoadError(f"isl_tokens must be finite and non-negative, got {isl_tokens}")
        if isl_tokens <= 0.0:
            return self.ttft_overhead_ms
        # Closed form (a loop per chunk never ends at 1e20 tokens): full chunks at their mean context, exact as
        # the step time is linear in prefill_kv_tokens, then the partial last chunk.
        chunk = float(max_num_batched_tokens)
        full = math.floor(isl_tokens / chunk)
        total = self.ttft_overhead_ms
        if full:
            total += full * self.step_time_ms(chunk, chunk * (full - 1) / 2.0, 0.0, 0.0)
        tail = isl_tokens - full * chunk
        if tail > 0.0:
            total += self.step_time_ms(tail, full * chunk, 0.0, 0.0)
        return total
