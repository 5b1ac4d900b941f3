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

Layout: the fit is in :mod:`perf_model.fit`, the prediction arithmetic (TTFT, ITL, capacity) in
:mod:`perf_model.predictions`; this module holds the model's learning, readiness and choice of step-time source,
and re-exports the public names.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence

import msgspec

from perf_model.errors import ModelNotReadyError
from perf_model.features import load_of
from perf_model.fit import StepTimeFit, fit_step_time
from perf_model.predictions import ReplicaCapacity, StepFn, StepTimePredictions, prefill_chunks_ms
from perf_model.samples import CoverageStore, Sample, SampleFilter, SampleVerdict, bin_of
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role
from planner.errors import ConfigError
from worker_shim.fpm import ForwardPassMetrics

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


class PerfModel(StepTimePredictions):
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

    def _require(self, *, prefill: bool, decode: bool) -> tuple[StepFn, float]:
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
