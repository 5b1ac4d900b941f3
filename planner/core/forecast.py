"""Request-rate forecasting for the predictive floor: constant, linear trend, Holt, Kalman. Pure functions of
a frozen :class:`ForecastState` and the new observation; time comes in as ``now``.

Every forecast is finite and >= 0. Irregular tick spacing is handled: Holt's trend and the Kalman slope are
per second, not per tick.
"""

from __future__ import annotations

import math

import msgspec

from planner.core.config import ForecastConfig, ForecastMethod

__all__ = [
    "ForecastState",
    "at_history_high",
    "beyond_counting_noise",
    "checked_floor",
    "damped_floor",
    "damped_forecast_rate",
    "derived_capacity",
    "forecast_rate",
    "noise_floor",
    "rise_beyond_noise",
    "rise_capped_rate",
    "trend_gain",
    "update_forecast",
]


def derived_capacity(
    state: ForecastState, rate_per_s: float | None, replicas: int, now: float, config: ForecastConfig
) -> tuple[ForecastState, float | None]:
    """Per-replica capacity for the floor when the config does not give one: ``rate / replicas`` at this tick, or
    the highest such figure seen, decayed by ``exp(-dt / history_s)``, whichever is higher. Derived from this
    tick alone, a trickle of requests on a replica held at its minimum reads as a tiny capacity, and the floor
    then multiplies any forecast into dozens of replicas (a surge's tail: 4 -> 32)."""
    kept: float | None = None
    if state.capacity_rps is not None and state.capacity_at is not None:
        kept = state.capacity_rps * math.exp(-max(now - state.capacity_at, 0.0) / config.history_s)
    current = rate_per_s / replicas if rate_per_s is not None and rate_per_s > 0 and replicas > 0 else None
    if current is not None and not math.isfinite(current):
        current = None
    if current is not None and (kept is None or current >= kept):
        return msgspec.structs.replace(state, capacity_rps=current, capacity_at=now), current
    return state, kept


class ForecastState(msgspec.Struct, frozen=True, kw_only=True):
    """History and filter state of one service's request-rate forecast."""

    history: tuple[tuple[float, float], ...] = ()  # (at, rate_per_s), within history_s
    last_at: float | None = None
    holt_level: float = 0.0
    holt_trend_per_s: float = 0.0
    kalman_level: float = 0.0
    kalman_slope_per_s: float = 0.0
    kalman_p: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 1.0)  # covariance, row-major
    # Requests/s one replica serves, derived from rate / recommended replicas: the highest seen, decaying over
    # history_s (at low load the recommendation sits at a floor and rate / replicas says nothing of capacity).
    capacity_rps: float | None = None
    capacity_at: float | None = None
    # The count when the recommendation began holding at current (not set by the load): while the hold lasts, the
    # derived capacity is rate / this count, not rate / a count the floor itself raised since (a ratchet).
    held_count: int | None = None
    # Holt's trend checked against what came (trend_gain): the rises it predicted horizon_s ahead, (due at, level
    # when predicted, rise), and the decayed sums of the rises predicted and of those that came (each capped at
    # its prediction).
    pending_rises: tuple[tuple[float, float, float], ...] = ()
    rise_predicted: float = 0.0
    rise_realized: float = 0.0


_PENDING_MAX = 64


def update_forecast(state: ForecastState, rate_per_s: float, now: float, config: ForecastConfig) -> ForecastState:
    """Fold one rate observation at ``now`` into ``state``. A non-finite or negative rate, or a ``now`` not
    after the last update, leaves the state unchanged. Holt's predicted rises that fall due are checked against
    this rate (:func:`trend_gain`)."""
    new = _update_filters(state, rate_per_s, now, config)
    if new is state:
        return state
    decay = math.exp(-(now - state.last_at) / config.history_s) if state.last_at is not None else 1.0
    predicted, realized = state.rise_predicted * decay, state.rise_realized * decay
    pending: list[tuple[float, float, float]] = []
    for due, base, rise in state.pending_rises:
        if due <= now:
            predicted += rise
            realized += min(max(rate_per_s - base, 0.0), rise)
        else:
            pending.append((due, base, rise))
    rise = new.holt_trend_per_s * config.horizon_s
    if rise > 0 and math.isfinite(rise):
        pending.append((now + config.horizon_s, new.holt_level, rise))
    return msgspec.structs.replace(
        new, pending_rises=tuple(pending[-_PENDING_MAX:]), rise_predicted=predicted, rise_realized=realized
    )


def trend_gain(state: ForecastState) -> float:
    """How much of Holt's predicted rises came true, in [0, 1]: the decayed sum (over ``history_s``) of the rises
    that came, each capped at its prediction, over the sum predicted; 1 before any prediction fell due. A trend
    that keeps being extrapolated from noise or from surges that stop (Azure's bursts: 323 req/s forecast as
    804 a start-up ahead) earns a small gain; a ramp that holds, a gain near 1."""
    if state.rise_predicted <= 0:
        return 1.0
    return min(max(state.rise_realized / state.rise_predicted, 0.0), 1.0)


RISE_SIGMAS = 3.0  # a rise must exceed this many standard deviations of two windows' Poisson request counts


def beyond_counting_noise(
    higher_per_s: float, lower_per_s: float, window_s: float, sigmas: float = RISE_SIGMAS
) -> bool:
    """Whether the request rate ``higher_per_s`` is above ``lower_per_s`` by more than ``sigmas`` standard deviations
    of the two windows' Poisson request counts over ``window_s`` (the sd of their difference: the square root of
    the two counts together, at least one request's). A rise (the later rate the higher) or a fall (the earlier)."""
    excess = (higher_per_s - lower_per_s) * window_s
    return excess > sigmas * math.sqrt(max((higher_per_s + lower_per_s) * window_s, 1.0))


def rise_beyond_noise(state: ForecastState, span_s: float, window_s: float, sigmas: float = RISE_SIGMAS) -> bool:
    """Whether the latest rate is above the rate ``span_s`` earlier (the latest history entry at least that old,
    else the oldest one at least ``window_s`` old) by more than ``sigmas`` standard deviations of the two
    windows' Poisson request counts over ``window_s`` (:func:`beyond_counting_noise`). Without such an entry: True
    (nothing says it is noise)."""
    if not state.history:
        return True
    now, rate = state.history[-1]
    past: float | None = None
    for at, value in state.history[:-1]:
        if at <= now - span_s:
            past = value
        elif past is None and at <= now - window_s:
            past = value
            break
    if past is None:
        return True
    return beyond_counting_noise(rate, past, window_s, sigmas)


def noise_floor(
    state: ForecastState,
    config: ForecastConfig,
    floor: int,
    load_replicas: int,
    capacity: float | None,
    window_s: float,
) -> tuple[int, str] | None:
    """The floor at Holt's level, without its trend, when the trend raises the floor above a load of two or more
    replicas while the rate has not risen over the last ``horizon_s`` beyond the counting noise of its traffic
    windows (:func:`rise_beyond_noise`); None otherwise. A trend fitted to noise is extrapolated a start-up ahead
    as a rise, and the scale-down window then holds the replica it asked for (a steady rate's +1 for good). A
    single load replica keeps it: it is that service's only spare against what the rate does not show (longer
    outputs, a burst), and one replica is the floor's granularity there."""
    if config.method != ForecastMethod.HOLT or load_replicas < 2 or floor <= load_replicas or not capacity:
        return None
    if state.last_at is None or rise_beyond_noise(state, config.horizon_s, window_s):
        return None
    level = max(state.holt_level, 0.0)
    need = level / capacity
    level_floor = math.ceil(need - 1e-9) if math.isfinite(need) else floor
    if level_floor >= floor:
        return None
    return level_floor, (
        f"the rate rose no more than {RISE_SIGMAS:g} sd of its windows' request counts over the last"
        f" {config.horizon_s:g} s: the trend is noise -> level {level:.2f} req/s, floor {level_floor}"
    )


def rise_capped_rate(state: ForecastState, config: ForecastConfig, predicted: float) -> tuple[float, str]:
    """Holt's forecast at a new high (:func:`at_history_high`) capped at the latest rate plus its rise over the
    last ``horizon_s`` (from the latest history entry at least that old, else the oldest): the next horizon is
    not forecast to rise more than the last one did. At an onset Holt's trend is one tick's jump over one tick,
    and ``horizon_s`` ahead that is a rise several times what came (a surge from idle: 175-208 req/s forecast
    against 63). Returns the rate and a note for the detail ("" when the cap does not bind)."""
    if config.method != ForecastMethod.HOLT or len(state.history) < 2 or not at_history_high(state):
        return predicted, ""
    now, rate = state.history[-1]
    past = state.history[0][1]
    for at, value in state.history[:-1]:
        if at <= now - config.horizon_s:
            past = value
    cap = rate + max(rate - past, 0.0)
    if predicted <= cap:
        return predicted, ""
    return cap, (
        f"; at a new high, Holt's {predicted:.2f} req/s capped at the rate {rate:.2f} plus its rise"
        f" {rate - past:.2f} over the last {config.horizon_s:g} s"
    )


def at_history_high(state: ForecastState) -> bool:
    """The latest rate is at least every earlier one within ``history_s``: traffic the history has not shown, so
    it says nothing about how far the trend will go."""
    if len(state.history) < 2:
        return True
    return state.history[-1][1] >= max(rate for _, rate in state.history[:-1])


def damped_forecast_rate(state: ForecastState, config: ForecastConfig) -> float | None:
    """Holt's forecast with its trend scaled by :func:`trend_gain`; the other methods' forecast as it is."""
    if config.method != ForecastMethod.HOLT or state.last_at is None or not state.history:
        return forecast_rate(state, config)
    value = state.holt_level + trend_gain(state) * state.holt_trend_per_s * config.horizon_s
    return max(0.0, value) if math.isfinite(value) else None


def checked_floor(
    state: ForecastState, config: ForecastConfig, floor: int, load_replicas: int, capacity: float | None
) -> int:
    """The floor with Holt's trend scaled by :func:`trend_gain` whether or not the rate is at its history's high,
    never below the load's count plus one nor above ``floor``: what a hold after the burst remembers of it."""
    if floor <= load_replicas + 1 or not capacity:
        return floor
    rate = damped_forecast_rate(state, config)
    if rate is None:
        return floor
    need = rate / capacity
    checked = max(load_replicas + 1, math.ceil(need - 1e-9) if math.isfinite(need) else floor)
    return min(checked, floor)


def damped_floor(
    state: ForecastState, config: ForecastConfig, floor: int, load_replicas: int, capacity: float | None
) -> tuple[int, str] | None:
    """The floor with Holt's trend scaled by :func:`trend_gain`, when that lowers a floor more than one replica
    above the load's count and the rate is not at its history's high (:func:`at_history_high`); None otherwise.
    Never below the load's count plus one: one replica is the floor's granularity, and what it adds on a steady
    rate's noise is left as it was."""
    if floor <= load_replicas + 1 or not capacity or at_history_high(state):
        return None
    rate = damped_forecast_rate(state, config)
    if rate is None:
        return None
    need = rate / capacity
    damped = max(load_replicas + 1, math.ceil(need - 1e-9) if math.isfinite(need) else floor)
    if damped >= floor:
        return None
    return damped, f"trend gain {trend_gain(state):.2f} (of its predicted rises, what came) -> floor {damped}"


def _update_filters(state: ForecastState, rate_per_s: float, now: float, config: ForecastConfig) -> ForecastState:
    if not math.isfinite(rate_per_s) or rate_per_s < 0:
        return state
    if state.last_at is not None and now <= state.last_at:
        return state
    cutoff = now - config.history_s
    history = (*tuple(item for item in state.history if item[0] > cutoff), (now, rate_per_s))
    if state.last_at is None:
        return ForecastState(
            capacity_rps=state.capacity_rps,
            capacity_at=state.capacity_at,
            held_count=state.held_count,
            history=history,
            last_at=now,
            holt_level=rate_per_s,
            holt_trend_per_s=0.0,
            kalman_level=rate_per_s,
            kalman_slope_per_s=0.0,
            kalman_p=(max(rate_per_s, 1.0) ** 2, 0.0, 0.0, 1.0),
        )
    dt = now - state.last_at
    # Holt's linear method with a per-second trend.
    predicted = state.holt_level + state.holt_trend_per_s * dt
    level = config.alpha * rate_per_s + (1 - config.alpha) * predicted
    trend = config.beta * (level - state.holt_level) / dt + (1 - config.beta) * state.holt_trend_per_s
    # Local linear trend Kalman filter: x = [level, slope], F = [[1, dt], [0, 1]], H = [1, 0].
    lvl, slope = state.kalman_level, state.kalman_slope_per_s
    p00, p01, p10, p11 = state.kalman_p
    scale = max(abs(lvl), abs(rate_per_s), 1.0)
    q = config.process_noise * scale * scale  # white-noise acceleration intensity (relative to the rate)
    r = config.measurement_noise * scale * scale
    x0 = lvl + slope * dt
    x1 = slope
    a00 = p00 + dt * (p10 + p01) + dt * dt * p11 + q * dt**3 / 3
    a01 = p01 + dt * p11 + q * dt * dt / 2
    a10 = p10 + dt * p11 + q * dt * dt / 2
    a11 = p11 + q * dt
    s = a00 + r
    k0 = a00 / s
    k1 = a10 / s
    innovation = rate_per_s - x0
    x0 += k0 * innovation
    x1 += k1 * innovation
    p_new = (
        (1 - k0) * a00,
        (1 - k0) * a01,
        a10 - k1 * a00,
        a11 - k1 * a01,
    )
    if not all(math.isfinite(v) for v in (level, trend, x0, x1, *p_new)):
        # Numerically lost: restart from the observation rather than carry NaN forward.
        return ForecastState(
            history=history,
            last_at=now,
            holt_level=rate_per_s,
            kalman_level=rate_per_s,
            capacity_rps=state.capacity_rps,
            capacity_at=state.capacity_at,
            held_count=state.held_count,
        )
    return ForecastState(
        capacity_rps=state.capacity_rps,
        capacity_at=state.capacity_at,
        held_count=state.held_count,
        history=history,
        last_at=now,
        holt_level=level,
        holt_trend_per_s=trend,
        kalman_level=x0,
        kalman_slope_per_s=x1,
        kalman_p=p_new,
    )


def _linear(history: tuple[tuple[float, float], ...], at: float) -> float:
    n = len(history)
    if n < 2:
        return history[-1][1]
    mean_t = sum(t for t, _ in history) / n
    mean_r = sum(r for _, r in history) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in history)
    if var_t <= 0:
        return mean_r
    slope = sum((t - mean_t) * (r - mean_r) for t, r in history) / var_t
    return mean_r + slope * (at - mean_t)


def forecast_rate(state: ForecastState, config: ForecastConfig) -> float | None:
    """The request rate expected ``horizon_s`` after the last update, or None without data / method."""
    if config.method == ForecastMethod.NONE or state.last_at is None or not state.history:
        return None
    horizon = config.horizon_s
    if config.method == ForecastMethod.CONSTANT:
        value = state.history[-1][1]
    elif config.method == ForecastMethod.LINEAR:
        value = _linear(state.history, state.last_at + horizon)
    elif config.method == ForecastMethod.HOLT:
        value = state.holt_level + state.holt_trend_per_s * horizon
    else:
        value = state.kalman_level + state.kalman_slope_per_s * horizon
    if not math.isfinite(value):
        return None
    return max(0.0, value)
