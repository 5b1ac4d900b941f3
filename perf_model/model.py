"""The online performance model of one engine role: learns step time from live FPM samples, predicts TTFT, ITL
and per-replica capacity with an uncertainty band, and falls back to a measured profile until live data
suffice.

Life of a sample (all pure: the caller passes ``now``)::

    observe(sample, now) -> SampleVerdict    heartbeat / invalid / wrong role / warm-up / outlier / accepted
        accepted -> CoverageStore             bounded, keeps every load level (see perf_model.samples)
    maybe_refit(now) -> bool                  on a cadence: robust non-negative fit (see StepTimeFit)

Where predictions come from (:class:`ModelSource`, in :meth:`PerfModel.status`): ``live`` once enough accepted
samples span enough of the load range and a fit exists; before that ``profile`` when a bootstrap
:class:`~perf_model.step_timer.ProfileStepTimer` was given; otherwise ``none``, and every prediction raises
:class:`~perf_model.errors.ModelNotReadyError` (the model never guesses).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Sequence

import msgspec
import numpy as np
from sklearn.linear_model import LinearRegression

from perf_model.api import LatencyEstimate
from perf_model.errors import InvalidLoadError, ModelNotReadyError
from perf_model.features import COLUMNS, HINGE_VARIABLES, Hinge, StepLoad, feature_row, hinge_name, load_of
from perf_model.samples import CoverageStore, Sample, SampleFilter, SampleVerdict, bin_of
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role
from planner.errors import ConfigError
from worker_shim.fpm import ForwardPassMetrics

_Step = Callable[[StepLoad], float]

__all__ = [
    "ModelSource",
    "PerfModel",
    "PerfModelConfig",
    "PerfModelStatus",
    "ReplicaCapacity",
    "StepTimeFit",
    "fit_step_time",
    "prefill_chunks_ms",
]


class ModelSource(enum.StrEnum):
    LIVE = "live"  # fitted on this fleet's FPM samples
    PROFILE = "profile"  # bootstrap: a measured profile, until live samples suffice
    NONE = "none"  # neither: predictions refuse


class PerfModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of the online model. Defaults suit a real fleet; tests with few samples lower the thresholds."""

    max_samples: int = 4096
    per_bin: int = 64
    warmup_steps: int = 16  # step samples dropped after each engine (re)start
    outlier_factor: float = 3.0  # observed/predicted beyond this (either way) is an outlier
    min_samples: int = 64  # accepted samples before a live fit may be trusted
    min_load_bins: int = 4  # half-octave bins each main load term must span (4 = a 4x range)
    refit_interval_s: float = 30.0
    band_quantile: float = 0.9  # upper_ms = value_ms * this quantile of observed/predicted (>= 1)
    bootstrap_band_frac: float = 0.10  # band around a profile's prediction (another deployment's numbers)
    trim_mads: float = 4.0  # robust fit: drop relative residuals beyond this many MADs, then refit
    ttft_overhead_ms: float | None = None  # request-path TTFT time in no step; None: the profile's, else 0

    def __post_init__(self) -> None:
        checks = (
            (self.max_samples >= 1, "max_samples must be >= 1"),
            (self.per_bin >= 1, "per_bin must be >= 1"),
            (self.warmup_steps >= 0, "warmup_steps must be >= 0"),
            (self.outlier_factor > 1.0, "outlier_factor must be > 1"),
            (self.min_samples >= 2, "min_samples must be >= 2"),
            (self.min_load_bins >= 1, "min_load_bins must be >= 1"),
            (self.refit_interval_s >= 0.0, "refit_interval_s must be >= 0"),
            (0.5 <= self.band_quantile < 1.0, "band_quantile must be in [0.5, 1)"),
            (0.0 <= self.bootstrap_band_frac < 10.0, "bootstrap_band_frac must be in [0, 10)"),
            (self.trim_mads > 0.0, "trim_mads must be > 0"),
            (self.ttft_overhead_ms is None or self.ttft_overhead_ms >= 0.0, "ttft_overhead_ms must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"perf model config: {message}")


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


class ReplicaCapacity(msgspec.Struct, frozen=True, kw_only=True):
    """Requests per second one replica sustains at the targets, for requests of ``isl_tokens``/``osl_tokens``.
    ``rps`` is the figure for the model's role: prefill_rps, decode_rps, or both shares of one engine
    (agg)."""

    rps: float
    prefill_rps: float
    decode_rps: float
    decode_batch: float  # largest decode batch meeting the ITL target (and KV capacity)
    ttft_alone_ms: float  # upper TTFT of one request on an idle engine


class PerfModelStatus(msgspec.Struct, frozen=True, kw_only=True):
    role: Role
    source: ModelSource
    ready: bool
    live_ready: bool
    not_ready_because: tuple[str, ...]  # why live predictions are not used yet (empty once live)
    samples: int
    bins: int
    accepted: int
    verdicts: dict[SampleVerdict, int]
    fits: int
    last_fit_at: float | None
    fit: StepTimeFit | None
    profile: str | None
    ttft_overhead_ms: float
    drifting: bool  # most recent samples far from the live fit: outlier rejection suspended until a refit


def prefill_chunks_ms(step: _Step, isl_tokens: float, queued_prefill_tokens: float, chunk_tokens: float) -> float:
    """Every step until the last chunk of an ``isl_tokens`` prompt queued behind ``queued_prefill_tokens`` of
    other prompts, in chunks of ``chunk_tokens``, in closed form (a constant number of ``step`` calls whatever
    the sizes: a loop per chunk never ends at 1e20 tokens, where ``1e20 + 8192 == 1e20``).

    The queue fills whole prefill-only steps (nothing cached); the prompt's first chunk shares the step with
    what is left of the queue; its full chunks read their earlier chunks, so their sum is ``full`` steps at
    the mean context, exact when the step time is linear in ``prefill_kv_tokens`` (the live fit and the
    profile timer both are); a partial last chunk follows. Absurd sizes give a huge or infinite time, never a
    hang nor NaN."""
    chunk = chunk_tokens
    total = 0.0
    full_queue_steps = math.floor(queued_prefill_tokens / chunk)
    if full_queue_steps:
        total += full_queue_steps * step((chunk, 0.0, 0.0, 0.0))
    # Rounding at huge sizes may leave the remainder just outside [0, chunk).
    queue_left = min(max(queued_prefill_tokens - full_queue_steps * chunk, 0.0), chunk)
    own = min(chunk - queue_left, isl_tokens)
    total += step((queue_left + own, 0.0, 0.0, 0.0))
    done = own
    rest = isl_tokens - done
    full = math.floor(rest / chunk) if rest > 0 else 0
    if full:
        total += full * step((chunk, done + chunk * (full - 1) / 2.0, 0.0, 0.0))
    tail = rest - full * chunk
    if tail > 0:
        total += step((tail, done + full * chunk, 0.0, 0.0))
    return total


def _load_check(*values: float) -> None:
    if not all(math.isfinite(v) and v >= 0.0 for v in values):
        raise InvalidLoadError(f"loads must be finite and non-negative, got {values}")


class PerfModel:
    """Implements :class:`perf_model.api.PerfPredictor` for engines of one role. Not thread-safe: one owner
    (the planner's runner) feeds and asks it::

        model = PerfModel(Role.DECODE, bootstrap=ProfileStepTimer.from_dir(profile_dir))
        for received_at, sample in store.window(worker_id, dp_rank):
            model.observe(sample, now=received_at)
        model.maybe_refit(now)
        model.predict_itl_ms(64, 64 * 3000).upper_ms
    """

    def __init__(
        self, role: Role, *, bootstrap: ProfileStepTimer | None = None, config: PerfModelConfig | None = None
    ) -> None:
        self.role = role
        self.config = config or PerfModelConfig()
        self.bootstrap = bootstrap
        self._filter = SampleFilter(
            role, warmup_steps=self.config.warmup_steps, outlier_factor=self.config.outlier_factor
        )
        self._store = CoverageStore(role, max_samples=self.config.max_samples, per_bin=self.config.per_bin)
        self._verdicts: dict[SampleVerdict, int] = dict.fromkeys(SampleVerdict, 0)
        self._fit: StepTimeFit | None = None
        self._fits = 0
        self._last_fit_at: float | None = None
        self._added_at_fit = 0
        self._fit_gaps: tuple[str, ...] | None = None  # readiness gaps judged at the last fit
        self._recent_far: deque[bool] = deque(maxlen=64)  # recent samples: far from the live fit?

    # -- learning --------------------------------------------------------------------------------------------

    def observe(self, sample: ForwardPassMetrics, now: float) -> SampleVerdict:
        """Offer one FPM sample; returns what became of it.

        Outliers are judged against the live fit only, never against the bootstrap profile (a fleet on other
        hardware than the profile's must still be able to learn). When most recent samples look like outliers
        the engines changed, not the samples: they are accepted again so the next refit follows
        (``status().drifting``)."""
        verdict = self._filter.check(sample)
        if verdict is SampleVerdict.ACCEPTED:
            load = load_of(sample.scheduled_requests)
            wall_ms = sample.wall_time * 1000.0
            if self._fit is not None and self._fit_gaps == ():
                far = self._filter.check_outlier(wall_ms, self._fit.step_ms(load))
                self._recent_far.append(far)
                if far and not self.drifting:
                    verdict = SampleVerdict.OUTLIER
            if verdict is SampleVerdict.ACCEPTED:
                self._store.add(Sample(load=load, wall_time_ms=wall_ms, at=now))
        self._verdicts[verdict] += 1
        return verdict

    @property
    def drifting(self) -> bool:
        """True when more than half of the last checked samples (at least 32 of them) were far from the live
        fit: the engines' speed changed and outlier rejection is suspended until a refit catches up."""
        recent = self._recent_far
        return len(recent) >= 32 and sum(recent) * 2 > len(recent)

    def observe_many(self, samples: Sequence[ForwardPassMetrics], now: float) -> None:
        for sample in samples:
            self.observe(sample, now)

    def maybe_refit(self, now: float) -> bool:
        """Refit when the cadence has passed and new samples arrived (or never fitted). Returns True on a
        fit."""
        if len(self._store) < 2 or self._store.added == self._added_at_fit:
            return False
        if self._last_fit_at is not None and now - self._last_fit_at < self.config.refit_interval_s:
            return False
        self.refit(now)
        return True

    def refit(self, now: float) -> StepTimeFit | None:
        samples = list(self._store)
        if len(samples) < 2:
            return None
        self._fit = fit_step_time(
            self.role,
            [s.load for s in samples],
            [s.wall_time_ms for s in samples],
            band_quantile=self.config.band_quantile,
            trim_mads=self.config.trim_mads,
        )
        self._fits += 1
        self._fit_gaps = self._compute_gaps()
        self._recent_far.clear()
        self._last_fit_at = now
        self._added_at_fit = self._store.added
        return self._fit

    # -- readiness -------------------------------------------------------------------------------------------

    def _live_gaps(self) -> tuple[str, ...]:
        """Why live predictions are not used. The range is judged on the samples of the last fit (a fit is what
        predictions use); before any fit only the sample count is reported."""
        if self._fit_gaps is None:
            n = len(self._store)
            count = (f"{n} accepted samples, need {self.config.min_samples}",) if n < self.config.min_samples else ()
            return (*count, "not fitted yet")
        return self._fit_gaps

    def _compute_gaps(self) -> tuple[str, ...]:
        cfg = self.config
        gaps: list[str] = []
        n = len(self._store)
        if n < cfg.min_samples:
            gaps.append(f"{n} accepted samples, need {cfg.min_samples}")
        terms: dict[str, int] = {}
        if self.role in (Role.PREFILL, Role.AGG):
            terms["prefill_tokens"] = 0
        if self.role in (Role.DECODE, Role.AGG):
            terms["decode_requests"] = 2
            terms["decode_kv_tokens"] = 3
        for name, index in terms.items():
            spanned = len({bin_of(s.load[index]) for s in self._store if s.load[index] > 0})
            if spanned < cfg.min_load_bins:
                gaps.append(f"{name} spans {spanned} half-octave bins, need {cfg.min_load_bins}")
        return tuple(gaps)

    @property
    def live_ready(self) -> bool:
        return not self._live_gaps()

    @property
    def source(self) -> ModelSource:
        if self.live_ready:
            return ModelSource.LIVE
        if self.bootstrap is not None:
            return ModelSource.PROFILE
        return ModelSource.NONE

    @property
    def ready(self) -> bool:
        return self.source is not ModelSource.NONE

    @property
    def ttft_overhead_ms(self) -> float:
        if self.config.ttft_overhead_ms is not None:
            return self.config.ttft_overhead_ms
        return self.bootstrap.ttft_overhead_ms if self.bootstrap is not None else 0.0

    def status(self) -> PerfModelStatus:
        gaps = self._live_gaps()
        source = self.source
        return PerfModelStatus(
            role=self.role,
            source=source,
            ready=source is not ModelSource.NONE,
            live_ready=not gaps,
            not_ready_because=gaps,
            samples=len(self._store),
            bins=self._store.bins,
            accepted=self._verdicts[SampleVerdict.ACCEPTED],
            verdicts=dict(self._verdicts),
            fits=self._fits,
            last_fit_at=self._last_fit_at,
            fit=self._fit,
            profile=self.bootstrap.params.profile if self.bootstrap is not None else None,
            ttft_overhead_ms=self.ttft_overhead_ms,
            drifting=self.drifting,
        )

    # -- predictions -----------------------------------------------------------------------------------------

    def _require(self, *, prefill: bool, decode: bool) -> tuple[_Step, float]:
        """The step-time function and band for a prediction involving prefill and/or decode work: the live fit
        when ready and its role learns that work, else the profile; a live fit of the other role (e.g. a decode
        engine's model asked for a TTFT) only when there is no profile (its floor is all it knows)."""
        fit = self._fit
        live = fit is not None and self.live_ready
        covers = (not prefill or self.role is not Role.DECODE) and (not decode or self.role is not Role.PREFILL)
        if fit is not None and live and (covers or self.bootstrap is None):
            return fit.step_ms, fit.band_ratio
        if self.bootstrap is not None:
            timer = self.bootstrap
            return (lambda load: timer.step_time_ms(*load)), 1.0 + self.config.bootstrap_band_frac
        gaps = "; ".join(self._live_gaps())
        raise ModelNotReadyError(f"perf model for {self.role} engines is not ready and has no profile: {gaps}")

    def predict_step_ms(
        self, prefill_tokens: float, prefill_kv_tokens: float, decode_requests: float, decode_kv_tokens: float
    ) -> LatencyEstimate:
        """Duration of one engine step with this batch."""
        _load_check(prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)
        step, band = self._require(prefill=prefill_tokens > 0, decode=decode_requests > 0)
        value = step((prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens))
        return LatencyEstimate(value_ms=value, upper_ms=value * band)

    def predict_itl_ms(self, decode_requests: float, decode_kv_tokens: float) -> LatencyEstimate:
        """ITL of one engine decoding ``decode_requests`` sequences holding ``decode_kv_tokens`` in total: the
        decode-only step time (an aggregated engine's prefill chunks come on top)."""
        _load_check(decode_requests, decode_kv_tokens)
        step, band = self._require(prefill=False, decode=True)
        value = step((0.0, 0.0, max(decode_requests, 1.0), decode_kv_tokens))
        return LatencyEstimate(value_ms=value, upper_ms=value * band)

    def predict_ttft_ms(
        self, isl_tokens: float, queued_prefill_tokens: float, max_num_batched_tokens: int
    ) -> LatencyEstimate:
        """TTFT of a request of ``isl_tokens`` behind ``queued_prefill_tokens`` on one engine prefilling in
        chunks of ``max_num_batched_tokens``: the request-path overhead plus every step until its last chunk.
        Queued tokens belong to other requests (read as having nothing cached); the request's own chunks read
        its earlier chunks."""
        _load_check(isl_tokens, queued_prefill_tokens)
        if max_num_batched_tokens < 1:
            raise InvalidLoadError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        step, band = self._require(prefill=True, decode=False)
        total = prefill_chunks_ms(step, max(isl_tokens, 1.0), queued_prefill_tokens, float(max_num_batched_tokens))
        overhead = self.ttft_overhead_ms
        return LatencyEstimate(value_ms=overhead + total, upper_ms=overhead + total * band)

    def capacity(
        self,
        *,
        isl_tokens: float,
        osl_tokens: float,
        ttft_target_ms: float,
        itl_target_ms: float,
        max_num_batched_tokens: int,
        max_kv_tokens: float | None = None,
        max_utilization: float = 0.95,
    ) -> ReplicaCapacity:
        """Requests/s one replica sustains with every prediction's upper band within the targets.

        Decode: the largest batch B whose ITL (each sequence holding ``isl + osl/2`` tokens on average) meets
        ``itl_target_ms`` and fits ``max_kv_tokens`` (at ``isl + osl`` each); a request then occupies the
        batch for ``osl`` steps, so ``rps = B / (osl * ITL)``.
        Prefill: a request costs ``S`` of engine time: its own prefill, sharing the step floor with the other
        requests of its chunk when ``isl < max_num_batched_tokens``. Requests arriving at random wait (M/D/1)
        on average ``rho*S / (2(1-rho))``; the largest ``rho`` (at most ``max_utilization``) keeping the
        lone-request TTFT plus that wait within ``ttft_target_ms`` gives ``rps = rho / S``.
        Aggregated engines share their time between the two: ``1 / (1/prefill_rps + 1/decode_rps)``."""
        _load_check(isl_tokens, osl_tokens, ttft_target_ms, itl_target_ms)
        if not 0.0 < max_utilization < 1.0:
            raise InvalidLoadError(f"max_utilization must be in (0, 1), got {max_utilization}")
        isl = max(isl_tokens, 1.0)
        osl = max(osl_tokens, 1.0)
        prefill_rps = 0.0
        ttft_alone = self.predict_ttft_ms(isl, 0.0, max_num_batched_tokens).upper_ms
        if self.role is not Role.DECODE and ttft_alone <= ttft_target_ms:
            chunk = float(max_num_batched_tokens)
            if isl >= chunk:
                service_ms = ttft_alone - self.ttft_overhead_ms
            else:  # chunk/isl requests share one step and its floor
                floor_ms = self.predict_step_ms(1.0, 0.0, 0.0, 0.0).upper_ms
                own_ms = self.predict_step_ms(isl, 0.0, 0.0, 0.0).upper_ms
                service_ms = own_ms - floor_ms + floor_ms * isl / chunk
            wait_ms = ttft_target_ms - ttft_alone
            rho = min(max_utilization, 2.0 * wait_ms / (service_ms + 2.0 * wait_ms)) if service_ms > 0 else 0.0
            prefill_rps = rho / service_ms * 1000.0 if service_ms > 0 else 0.0
        decode_rps = 0.0
        batch = 0.0
        if self.role is not Role.PREFILL:
            ctx = isl + osl / 2.0
            limit = 1 << 20
            if max_kv_tokens is not None:
                limit = min(limit, int(max_kv_tokens // (isl + osl)))
            lo, hi = 0, limit
            while lo < hi:  # largest B in [0, limit] with ITL(B) within the target
                mid = (lo + hi + 1) // 2
                if self.predict_itl_ms(mid, mid * ctx).upper_ms <= itl_target_ms:
                    lo = mid
                else:
                    hi = mid - 1
            batch = float(lo)
            if batch > 0:
                itl = self.predict_itl_ms(batch, batch * ctx).upper_ms
                decode_rps = batch / (osl * itl / 1000.0)
        if self.role is Role.PREFILL:
            rps = prefill_rps
        elif self.role is Role.DECODE:
            rps = decode_rps
        else:
            rps = 1.0 / (1.0 / prefill_rps + 1.0 / decode_rps) if prefill_rps > 0 and decode_rps > 0 else 0.0
        return ReplicaCapacity(
            rps=rps,
            prefill_rps=prefill_rps,
            decode_rps=decode_rps,
            decode_batch=batch,
            ttft_alone_ms=ttft_alone,
        )
