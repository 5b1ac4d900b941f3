"""Deterministic synthetic scenarios for the replay (``fpm-planner replay --scenario NAME``).

Each scenario is a request-rate curve and ISL / OSL distributions over time; :func:`scenario_trace` draws a
seeded non-homogeneous Poisson process from it (thinning against the curve's peak), with log-normal prompt and
output lengths around time-varying medians, so the same name and seed always give the same trace. Rates are in
requests per second for the simulated Llama-3.1-8B-FP8 / H200 engines (one replica serves roughly 15-30 of
these requests per second, so the peaks below need several replicas and the troughs one or two).

| name | what it tests |
|---|---|
| ``surge_from_idle`` | near-idle for 10 min, then 60 req/s at once for 15 min, then idle again |
| ``diurnal_ramp`` | a compressed day: rate from 4 to 60 req/s and back along a cosine over 60 min |
| ``flash_crowd`` | 8 req/s with a 10x flash crowd (80 req/s) for 3 min in the middle |
| ``prompt_shift`` | steady 20 req/s; prompts short (median 300 tokens) then long (median 4000) from minute 15 |
| ``output_shift`` | steady 20 req/s; outputs short (median 40 tokens) then long (median 600) from minute 15 |
| ``slow_drift`` | rate from 10 to 40 req/s and prompt median from 800 to 2000 tokens, linearly over 60 min |
| ``bursty`` | 12 req/s with 4x bursts (48 req/s) of random length (mean 60 s) every ~4 min (Markov-modulated) |
| ``burst_train`` | 15 req/s with 3x bursts (45 req/s) of mean 90 s every ~2.5 min, longer prompts (Markov-modulated) |
| ``prefix_reuse`` | 40 sessions re-sending 8-16k-token histories (prefix-cache hits); 4 -> 16 -> 8 req/s, 15 min |

A scenario with ``bursts`` is a Markov-modulated Poisson process: before the arrivals, the seed draws alternating
off / on periods (exponential lengths, the first state drawn from the stationary odds) and the rate curve is
multiplied by ``bursts.factor`` while a burst is on. Real traffic is burstier than a Poisson process with a smooth
rate (the Azure traces are); ``bursty`` is for the held-out suite (docs/replay-heldout/), not the 32-run suite.
``burst_train`` is the bursty traffic a core change may be tuned on (docs/replay-dev/): other burst factor, burst and
gap lengths, base rate and prompt / output lengths than ``bursty``, so the held-out runs stay out of sample.

A scenario with ``sessions`` has prefix reuse (``hash_ids``, the engines' prefix cache hits them): each request
belongs to one of ``sessions.count`` sessions (drawn with Zipf popularity, weight ``1 / rank ** exponent``), and its
prompt is that session's history (a fixed number of blocks per session, drawn per seed) followed by its own new
tokens (log-normal around ``isl_median``), ``block_tokens`` per hash id as Mooncake's. Chat and agent traffic
re-sends its history with every turn; the other scenarios' prompts share nothing. ``prefix_reuse`` is in no suite:
it is where sizing prefill on the whole prompt (the core does; FPM's scheduled prefill tokens leave the cache hits
out) costs most, and where an estimate of the prefill work computed is to be judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec
import numpy as np

from planner.errors import ConfigError
from planner.sim.traces import Trace

__all__ = ["SCENARIOS", "Bursts", "Scenario", "Sessions", "scenario_trace"]

Curve = Callable[[np.ndarray], np.ndarray]  # seconds -> value, vectorised


class Bursts(msgspec.Struct, frozen=True, kw_only=True):
    """On / off bursts of random (exponential) length: the rate is ``factor`` times the curve while one is on."""

    factor: float
    mean_on_s: float
    mean_off_s: float


class Sessions(msgspec.Struct, frozen=True, kw_only=True):
    """Prefix reuse: ``count`` sessions, each with a history of ``history_blocks`` (low, high inclusive) blocks of
    ``block_tokens`` drawn per seed, chosen per request with weight ``1 / rank ** popularity_exponent``."""

    count: int
    history_blocks: tuple[int, int]
    popularity_exponent: float = 0.8
    block_tokens: int = 512


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    """A rate curve and median ISL / OSL curves over ``duration_s``; lengths are log-normal with ``sigma``."""

    name: str
    description: str
    duration_s: float
    peak_rate_per_s: float  # an upper bound of ``rate`` (thinning; times ``bursts.factor`` with bursts)
    rate: Curve
    isl_median: Curve
    osl_median: Curve
    isl_sigma: float = 0.6
    osl_sigma: float = 0.6
    bursts: Bursts | None = None
    sessions: Sessions | None = None  # with it, a prompt is its session's history + its own isl_median tokens


def _const(value: float) -> Curve:
    return lambda t: np.full(t.shape, float(value))


def _step(before: float, after: float, at_s: float) -> Curve:
    return lambda t: np.where(t < at_s, float(before), float(after))


def _window(base: float, high: float, start_s: float, end_s: float) -> Curve:
    return lambda t: np.where((t >= start_s) & (t < end_s), float(high), float(base))


def _linear(start: float, end: float, duration_s: float) -> Curve:
    return lambda t: start + (end - start) * np.clip(t / duration_s, 0.0, 1.0)


def _diurnal(low: float, high: float, duration_s: float) -> Curve:
    return lambda t: low + (high - low) * 0.5 * (1.0 - np.cos(2.0 * math.pi * t / duration_s))


def _piecewise(times_s: tuple[float, ...], values: tuple[float, ...]) -> Curve:
    return lambda t: np.interp(t, times_s, values)


def _burst_windows(bursts: Bursts, duration_s: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times of the on periods over ``duration_s``: alternating exponential off / on lengths, the
    state at 0 drawn with the stationary odds (on with probability mean_on / (mean_on + mean_off))."""
    on = bool(rng.random() * (bursts.mean_on_s + bursts.mean_off_s) < bursts.mean_on_s)
    starts: list[float] = []
    ends: list[float] = []
    t = 0.0
    while t < duration_s:
        length = float(rng.exponential(bursts.mean_on_s if on else bursts.mean_off_s))
        if on:
            starts.append(t)
            ends.append(t + length)
        t += length
        on = not on
    return np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)


def _modulated(curve: Curve, starts: np.ndarray, ends: np.ndarray, factor: float) -> Curve:
    def rate(t: np.ndarray) -> np.ndarray:
        index = np.searchsorted(starts, t, side="right") - 1
        inside = (index >= 0) & (t < ends[np.maximum(index, 0)]) if starts.size else np.zeros(t.shape, dtype=bool)
        scaled: np.ndarray = curve(t) * np.where(inside, factor, 1.0)
        return scaled

    return rate


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="surge_from_idle",
            description="near-idle 10 min, 60 req/s for 15 min, near-idle 10 min",
            duration_s=2100.0,
            peak_rate_per_s=60.0,
            rate=_window(0.05, 60.0, 600.0, 1500.0),
            isl_median=_const(1000.0),
            osl_median=_const(150.0),
        ),
        Scenario(
            name="diurnal_ramp",
            description="4 -> 60 -> 4 req/s along a cosine over 60 min",
            duration_s=3600.0,
            peak_rate_per_s=60.0,
            rate=_diurnal(4.0, 60.0, 3600.0),
            isl_median=_const(1000.0),
            osl_median=_const(150.0),
        ),
        Scenario(
            name="flash_crowd",
            description="8 req/s, 10x (80 req/s) for 3 min from minute 12, 30 min in all",
            duration_s=1800.0,
            peak_rate_per_s=80.0,
            rate=_window(8.0, 80.0, 720.0, 900.0),
            isl_median=_const(1000.0),
            osl_median=_const(150.0),
        ),
        Scenario(
            name="prompt_shift",
            description="20 req/s; prompt median 300 then 4000 tokens from minute 15, 30 min in all",
            duration_s=1800.0,
            peak_rate_per_s=20.0,
            rate=_const(20.0),
            isl_median=_step(300.0, 4000.0, 900.0),
            osl_median=_const(150.0),
        ),
        Scenario(
            name="output_shift",
            description="20 req/s; output median 40 then 600 tokens from minute 15, 30 min in all",
            duration_s=1800.0,
            peak_rate_per_s=20.0,
            rate=_const(20.0),
            isl_median=_const(1000.0),
            osl_median=_step(40.0, 600.0, 900.0),
        ),
        Scenario(
            name="slow_drift",
            description="10 -> 40 req/s and prompt median 800 -> 2000 tokens, linearly over 60 min",
            duration_s=3600.0,
            peak_rate_per_s=40.0,
            rate=_linear(10.0, 40.0, 3600.0),
            isl_median=_linear(800.0, 2000.0, 3600.0),
            osl_median=_const(150.0),
        ),
        Scenario(
            name="bursty",
            description="12 req/s, 4x bursts (48 req/s) of mean 60 s, mean 240 s apart (Markov-modulated), 30 min",
            duration_s=1800.0,
            peak_rate_per_s=12.0,
            rate=_const(12.0),
            isl_median=_const(1000.0),
            osl_median=_const(150.0),
            bursts=Bursts(factor=4.0, mean_on_s=60.0, mean_off_s=240.0),
        ),
        Scenario(
            name="burst_train",
            description="15 req/s, 3x bursts (45 req/s) of mean 90 s, mean 150 s apart (Markov-modulated), 30 min",
            duration_s=1800.0,
            peak_rate_per_s=15.0,
            rate=_const(15.0),
            isl_median=_const(1500.0),
            osl_median=_const(200.0),
            bursts=Bursts(factor=3.0, mean_on_s=90.0, mean_off_s=150.0),
        ),
        Scenario(
            name="prefix_reuse",
            description="40 sessions re-sending 8-16k-token histories; 4 -> 16 req/s over 7.5 min, held, 8 by 15 min",
            duration_s=900.0,
            peak_rate_per_s=16.0,
            rate=_piecewise((0.0, 450.0, 600.0, 900.0), (4.0, 16.0, 16.0, 8.0)),
            isl_median=_const(1000.0),
            osl_median=_const(150.0),
            sessions=Sessions(count=40, history_blocks=(16, 31)),
        ),
    )
}

_MAX_ISL = 32000
_MAX_OSL = 4000


def scenario_trace(name: str, *, seed: int = 0) -> Trace:
    """The trace of scenario ``name`` (see the module docstring) drawn with ``seed``; a
    :class:`~planner.errors.ConfigError` names the known scenarios for an unknown name."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    peak = scenario.peak_rate_per_s
    rate = scenario.rate
    if scenario.bursts is not None:
        starts, ends = _burst_windows(scenario.bursts, scenario.duration_s, rng)
        rate = _modulated(rate, starts, ends, scenario.bursts.factor)
        peak *= scenario.bursts.factor
    count = int(rng.poisson(peak * scenario.duration_s))
    candidates = np.sort(rng.random(count) * scenario.duration_s)
    keep = rng.random(count) * peak < rate(candidates)
    arrival = candidates[keep]
    if arrival.size == 0:
        raise ConfigError(f"scenario {name!r} drew no requests with seed {seed}")
    isl = np.exp(np.log(scenario.isl_median(arrival)) + scenario.isl_sigma * rng.standard_normal(arrival.size))
    osl = np.exp(np.log(scenario.osl_median(arrival)) + scenario.osl_sigma * rng.standard_normal(arrival.size))
    own = np.clip(np.rint(isl), 1, _MAX_ISL).astype(np.int64)
    hash_ids: tuple[tuple[int, ...] | None, ...] = (None,) * int(arrival.size)
    if scenario.sessions is not None:
        own, hash_ids = _session_prompts(scenario.sessions, own, rng)
    return Trace(
        name=f"scenario:{name}",
        arrival_s=arrival - arrival[0],
        isl=own,
        osl=np.clip(np.rint(osl), 1, _MAX_OSL).astype(np.int64),
        hash_ids=hash_ids,
    )


def _session_prompts(
    sessions: Sessions, own_tokens: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """Each request's prompt length and hash ids: its session's history blocks (ids ``session * stride + k``), then
    its own tokens in blocks no other request has (ids from ``count * stride`` up), at most ``_MAX_ISL`` tokens."""
    low, high = sessions.history_blocks
    history = rng.integers(low, high + 1, sessions.count)
    weight = 1.0 / np.arange(1, sessions.count + 1) ** sessions.popularity_exponent
    chosen = rng.choice(sessions.count, size=own_tokens.size, p=weight / weight.sum())
    block = sessions.block_tokens
    stride = int(history.max()) + 1
    fresh = sessions.count * stride
    isl = np.empty(own_tokens.size, dtype=np.int64)
    hashes: list[tuple[int, ...]] = []
    for i, (session, own) in enumerate(zip(chosen.tolist(), own_tokens.tolist(), strict=True)):
        shared = int(history[session])
        total = min(shared * block + own, _MAX_ISL)
        blocks = -(-total // block)
        kept = min(shared, blocks)
        ids = [session * stride + k for k in range(kept)]
        ids.extend(range(fresh, fresh + blocks - kept))
        fresh += blocks - kept
        isl[i] = total
        hashes.append(tuple(ids))
    return isl, tuple(hashes)
