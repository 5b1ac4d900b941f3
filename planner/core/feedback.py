"""SLA mode's closed loop: the observed attainment corrects the model's headroom (issue 13, item 3b).

The perf model predicts latency; what users felt comes back as ``Traffic.ttft_attainment_frac`` and
``itl_attainment_frac`` (the share of the window's requests within each target, with how many requests they rest
on). A bounded integral correction per target turns the gap to the goal into headroom::

    correction += gain_per_s x (goal - attainment) x dt        (dt capped at max_step_s; relaxing at
                                                              relax_gain_ratio of the gain)

added to the configured headroom, so the TTFT / ITL limit recommend checks is ``target x (1 - headroom -
correction)`` (an ITL tightening scaled to the span above the model's floor, planner.core.latency_floor): a
shortfall tightens the limit (more replicas), an attainment above the goal slowly relaxes it (fewer).
Anti-windup: the correction stays in ``[-max_relax_frac, max_tighten_frac]``, and it does not tighten
while the capacity it would ask for cannot come (an action in flight, or the last decision capped below its
recommendation) and for one attainment window after an action in flight settled: a window still full of
misses from before the capacity arrived must not wind it up. Nor while the requests reported in the window that
arrived before the last action in flight settled (their TTFT longer than the time since, read from the observed
TTFT p50/p90/p99: at least 50 / 10 / 1 % of them) are most of the window or may account for all of its misses:
they queued on the engines up then, and no capacity decided now serves them (prompt_shift: one tick after the
hold, a window of such misses wound the correction to its bound). Nor, within one start-up of the last action in
flight settling, while the prefill queue falls fast enough to be gone within a start-up: the backlog that built
before the capacity came drains on the capacity up, and the misses are its requests (queued, or decoding through
its prompts' chunks). Nor, for the ITL, while the window's requests may have decoded before the capacity came:
the time since the last action in flight settled shorter than their decode lifetime, (OSL p99 - 1) x ITL p99,
beyond taking back a relaxation (planner.core.stale_misses). With no usable observation (unknown, or fewer than
``min_samples`` requests) it decays toward 0 with ``decay_s``.

A relaxed correction (negative) is a calibration measured on the requests it was earned on, and is not
extrapolated beyond them: it remembers the range of work per request (prompt plus output tokens) of the windows
whose relaxation counted (:class:`RelaxRange`: the lowest and highest window means, widened by the spread the
windows themselves showed, p90 over the mean), and is forgotten with the relaxation. On aggregated engines, when
the traffic's mean request is larger than that range, recommend applies only the relaxation re-earned on requests
beyond it (the observation's evidence, counted also while the correction is held at its bound), never more than
the correction; once it is re-earned whole there, the range grows to the new size. There the prediction is
composed (prompt chunks sharing steps with decodes, each chunk attending to the earlier ones, the decode batch a
fixed point) and its error depends on that mix, which the requests' size sets: a model found pessimistic on
300-token prompts says nothing about 4,000-token ones. Smaller requests are the safe side (the model's error
there is the better-measured, lighter load): they get the relaxation whole. Prefill-only and decode-only engines
keep it whole: each is predicted from its own measured step times for one kind of work, whose error does not
change with the mix. The correction itself is unchanged.

Pure: ``now`` is an argument; the state is :class:`FeedbackState`, kept in the service's
:class:`planner.core.state.ServiceState`.
"""

from __future__ import annotations

import math

import msgspec

from planner.core.config import SlaFeedbackConfig
from planner.core.decision import Reason
from planner.core.observation import Traffic
from planner.core.stale_misses import itl_misses_may_predate
from planner.core.windup import WindupTrack, update_windup

__all__ = ["FeedbackState", "FeedbackUpdate", "RelaxRange", "request_work_tokens", "update_feedback"]


class RelaxRange(msgspec.Struct, frozen=True, kw_only=True):
    """The work per request (prompt plus output tokens) a relaxed correction was earned on: the lowest and highest
    mean of the windows whose relaxation counted, and those windows' own spread (p90 over the mean, weighted by
    the relaxation each added). ``beyond_frac``: the relaxation re-earned since the requests grew past the range
    (what recommend applies there)."""

    lo_tokens: float
    hi_tokens: float
    spread_tokens: float = 0.0
    beyond_frac: float = 0.0

    def covers(self, work_tokens: float) -> bool:
        """Whether a traffic of this mean work per request lies within what the relaxation was measured on (or
        below it: the safe side)."""
        return work_tokens <= self.hi_tokens + self.spread_tokens


class FeedbackState(msgspec.Struct, frozen=True, kw_only=True):
    """The corrections (fractions of each target added to the headroom; negative relaxes) and when they moved."""

    ttft_frac: float = 0.0
    itl_frac: float = 0.0
    last_at: float | None = None
    capped: bool = False  # the last decision ended below its recommendation (budget, bounds, rate limit)
    # Until when tightening stays frozen after an action in flight settled: the attainment window still holds
    # the misses of requests that arrived before the new capacity served.
    hold_until: float | None = None
    # The last tick an action was in flight: capacity came after it. A request reported later with a TTFT longer
    # than the time since arrived before (it queued on the engines up then, which no later capacity relieves).
    in_flight_at: float | None = None
    # The prefill queue (queued prompt tokens) at the last update: a queue falling since says the capacity up drains
    # the backlog that built before it came.
    queued_prefill_tokens: float | None = None
    # The request sizes each relaxed correction was earned on; None: no relaxation in force, or earned on traffic of
    # unknown size (then applied whole).
    ttft_relaxed_range: RelaxRange | None = None
    itl_relaxed_range: RelaxRange | None = None
    # Each correction at its tighten bound: the attainment there and the actions settled since
    # (planner.core.windup).
    ttft_windup: WindupTrack = WindupTrack()
    itl_windup: WindupTrack = WindupTrack()


class FeedbackUpdate(msgspec.Struct, frozen=True, kw_only=True):
    state: FeedbackState
    reason: Reason | None  # None: no correction in force and none moved
    detail: str
    # The corrections recommend applies: the state's, a relaxed one only as far as re-earned when the requests are
    # larger now than the range it was earned on.
    ttft_frac: float = 0.0
    itl_frac: float = 0.0
    # A correction at its bound whose settled capacity did not raise the attainment, and none tightening: the
    # count is held where it is (planner.core.windup); the detail says why.
    wound: bool = False
    wound_detail: str = ""


def request_work_tokens(traffic: Traffic | None) -> float | None:
    """The traffic's mean work per request, prompt plus output tokens (None: its prompt length is not known)."""
    if traffic is None or not traffic.isl_tokens or traffic.isl_tokens <= 0:
        return None
    return traffic.isl_tokens + max(traffic.osl_tokens or 0.0, 0.0)


def _window_spread_tokens(traffic: Traffic, work: float) -> float:
    """How far the window's larger requests reach past its mean: p90 prompt plus p90 output tokens over the mean
    work (each p90 falling back to its mean when not known); 0 at least."""
    isl = traffic.isl_tokens_p90 if traffic.isl_tokens_p90 is not None else traffic.isl_tokens
    osl = traffic.osl_tokens_p90 if traffic.osl_tokens_p90 is not None else traffic.osl_tokens
    return max((isl or 0.0) + max(osl or 0.0, 0.0) - work, 0.0)


def _relaxed_range(
    before: float, after: float, earned: RelaxRange | None, work: float | None, spread: float, evidence: float
) -> RelaxRange | None:
    """The range a relaxed correction rests on after it moved ``before`` -> ``after``. ``evidence``: the relaxation
    this tick's observation asks for (before the bound), so a correction held at its bound still counts the
    traffic now. Inside the range (or below it) a tick that relaxed widens it to this window; beyond it, the
    relaxation asked accumulates in ``beyond_frac`` until it is the whole correction, and then the range grows to
    this window. A correction shrinking (tightened, decayed) keeps its range; one gone forgets it."""
    relaxed = max(-after, 0.0)
    if relaxed <= 0.0:
        return None
    added = max(relaxed - max(-before, 0.0), evidence, 0.0)
    if work is None:
        return earned
    if earned is None:
        if added <= 0.0 or before < 0.0:  # earned before on traffic of unknown size: not attributable
            return None
        return RelaxRange(lo_tokens=work, hi_tokens=work, spread_tokens=spread)
    weight = min(added / relaxed, 1.0)
    if earned.covers(work):
        if added <= 0.0:
            return msgspec.structs.replace(earned, beyond_frac=0.0)
        return RelaxRange(
            lo_tokens=min(earned.lo_tokens, work),
            hi_tokens=max(earned.hi_tokens, work),
            spread_tokens=earned.spread_tokens + (spread - earned.spread_tokens) * weight,
        )
    beyond = earned.beyond_frac + added
    if beyond < relaxed:
        return msgspec.structs.replace(earned, beyond_frac=beyond)
    return RelaxRange(  # re-earned whole on these larger requests: the range grows to them
        lo_tokens=earned.lo_tokens,
        hi_tokens=work,
        spread_tokens=earned.spread_tokens + (spread - earned.spread_tokens) * weight,
    )


def _applied(correction: float, earned: RelaxRange | None, work: float | None) -> float:
    """The correction recommend applies: a relaxed one, when the requests are larger now than its range, only the
    part re-earned on them."""
    if correction >= 0.0 or earned is None or work is None or earned.covers(work):
        return correction
    return -min(-correction, earned.beyond_frac)


def _relax_evidence(attainment: float | None, samples: int | None, dt: float, cfg: SlaFeedbackConfig) -> float:
    """The relaxation an attainment above the goal asks for this tick, before the bound (0: none)."""
    if attainment is None or samples is None or samples < cfg.min_samples or attainment <= cfg.attainment_goal:
        return 0.0
    return cfg.gain_per_s * cfg.relax_gain_ratio * (attainment - cfg.attainment_goal) * dt


def _one(
    current: float,
    attainment: float | None,
    samples: int | None,
    dt: float,
    cfg: SlaFeedbackConfig,
    frozen: bool,
) -> tuple[float, str]:
    """One target's new correction and what moved it: ``tighten`` / ``relax`` / ``clamped`` / ``frozen`` /
    ``decay`` / ``""`` (unchanged at 0)."""
    usable = attainment is not None and samples is not None and samples >= cfg.min_samples
    if not usable:
        if current == 0.0:
            return 0.0, ""
        decayed = current * math.exp(-dt / cfg.decay_s)
        return (0.0 if abs(decayed) < 1e-4 else decayed), "decay"
    assert attainment is not None
    error = cfg.attainment_goal - attainment
    if error > 0 and frozen:
        return current, "frozen"
    gain = cfg.gain_per_s * (1.0 if error > 0 else cfg.relax_gain_ratio)
    raw = current + gain * error * dt
    bounded = min(max(raw, -cfg.max_relax_frac), cfg.max_tighten_frac)
    if bounded != raw:
        return bounded, "clamped"
    if raw > current:
        return raw, "tighten"
    if raw < current:
        return raw, "relax"
    return raw, ""


_REASONS = {
    "tighten": Reason.SLA_FEEDBACK_TIGHTENED,
    "relax": Reason.SLA_FEEDBACK_RELAXED,
    "clamped": Reason.SLA_FEEDBACK_CLAMPED,
    "frozen": Reason.SLA_FEEDBACK_FROZEN,
    "decay": Reason.SLA_FEEDBACK_DECAYED,
    "beyond_range": Reason.SLA_FEEDBACK_RELAX_BEYOND_RANGE,
}
_PRIORITY = ("beyond_range", "clamped", "frozen", "tighten", "relax", "decay")
_DEFAULT_WINDOW_S = 30.0  # the attainment window when the traffic does not say


def _share_arrived_before(traffic: Traffic, age_s: float) -> float:
    """A lower bound on the share of the window's reported requests that arrived more than ``age_s`` ago (TTFT
    longer than that), from the observed TTFT percentiles: 0.5 past the p50, 0.1 past the p90, 0.01 past the
    p99, else 0."""
    age_ms = max(age_s, 0.0) * 1000.0
    for share, value in ((0.5, traffic.ttft_ms_p50), (0.1, traffic.ttft_ms_p90), (0.01, traffic.ttft_ms_p99)):
        if value is not None and value > age_ms:
            return share
    return 0.0


def update_feedback(
    state: FeedbackState,
    traffic: Traffic | None,
    now: float,
    cfg: SlaFeedbackConfig,
    *,
    in_flight: bool,
    queued_prefill_tokens: float | None = None,
    startup_s: float = 0.0,
    aggregated: bool = False,
) -> FeedbackUpdate:
    """Fold this tick's observed attainment into the corrections (see the module docstring).
    ``queued_prefill_tokens``: the role's prefill queue now (None: not known); ``startup_s``: the start-up delay
    the core plans with (the TTFT loop holds while a backlog left by a settled scale-up drains within one)."""
    if not cfg.enabled:
        return FeedbackUpdate(state=FeedbackState(last_at=now), reason=None, detail="")
    dt = 0.0 if state.last_at is None else min(max(now - state.last_at, 0.0), cfg.max_step_s)
    t = traffic or Traffic()
    window_s = t.window_s if t.window_s is not None else _DEFAULT_WINDOW_S
    hold_until = now + window_s if in_flight else state.hold_until
    in_flight_at = now if in_flight else state.in_flight_at
    before = 0.0 if in_flight or in_flight_at is None else _share_arrived_before(t, now - in_flight_at)
    frozen = in_flight or state.capped or (hold_until is not None and now < hold_until)
    # Misses of requests that arrived while capacity was coming say nothing about the capacity now: while such
    # requests are most of the window (past its TTFT p50), or may be all of its misses (their share at least the
    # shortfall), the loop does not tighten on them.
    for attained in (t.ttft_attainment_frac, t.itl_attainment_frac):
        if before > 0 and attained is not None and (before >= 0.5 or 1.0 - attained <= before):
            frozen = True
    # A backlog that built before the last scale-up's capacity came, falling since the last tick fast enough to be
    # gone within one start-up: the capacity up drains it, so capacity decided now would come after it; the misses
    # it still causes are the backlog's -- its requests queued, and the decodes riding along with its prompt chunks
    # (prompt_shift: one tick after the hold, ITL misses of 61 % wound the ITL correction to its bound, 5 -> 8
    # replicas, while the queue fell from 1.0M to 0.66M tokens and was gone 10 s later).
    draining_s = _backlog_drains_in_s(state, queued_prefill_tokens, now, dt)
    backlog_draining = (
        not in_flight
        and in_flight_at is not None
        and startup_s > 0
        and now - in_flight_at <= startup_s
        and draining_s is not None
        and draining_s <= startup_s
    )
    ttft, ttft_how = _one(
        state.ttft_frac, t.ttft_attainment_frac, t.ttft_samples_in_window, dt, cfg, frozen or backlog_draining
    )
    # ITL misses of requests that may have decoded before the capacity came (planner.core.stale_misses) ...
    itl_stale_s = itl_misses_may_predate(t, None if in_flight or in_flight_at is None else now - in_flight_at)
    itl, itl_how = _one(
        state.itl_frac, t.itl_attainment_frac, t.itl_samples_in_window, dt, cfg, frozen or backlog_draining
    )
    # ... they judge the count they ran at: they may take back a relaxation, not tighten past the model's own
    stale_capped = itl_stale_s is not None and itl > max(state.itl_frac, 0.0)
    if stale_capped:
        itl = max(state.itl_frac, 0.0)
        itl_how = "tighten" if itl > state.itl_frac else "frozen"
    else:
        itl_stale_s = None
    work = request_work_tokens(traffic)
    spread = 0.0 if work is None else _window_spread_tokens(t, work)
    ttft_on = _relaxed_range(
        state.ttft_frac,
        ttft,
        state.ttft_relaxed_range,
        work,
        spread,
        _relax_evidence(t.ttft_attainment_frac, t.ttft_samples_in_window, dt, cfg),
    )
    itl_on = _relaxed_range(
        state.itl_frac,
        itl,
        state.itl_relaxed_range,
        work,
        spread,
        _relax_evidence(t.itl_attainment_frac, t.itl_samples_in_window, dt, cfg),
    )
    settled_now = not in_flight and state.in_flight_at is not None and state.in_flight_at == state.last_at
    quiet = not in_flight and not (hold_until is not None and now < hold_until)
    ttft_wind = update_windup(
        state.ttft_windup,
        at_bound=ttft >= cfg.max_tighten_frac,
        attainment=t.ttft_attainment_frac,
        samples=t.ttft_samples_in_window,
        min_samples=cfg.min_samples,
        settled_now=settled_now,
        quiet=quiet,
        after_settled=cfg.windup_settled_actions,
    )
    itl_wind = update_windup(
        state.itl_windup,
        at_bound=itl >= cfg.max_tighten_frac,
        attainment=t.itl_attainment_frac,
        samples=t.itl_samples_in_window,
        min_samples=cfg.min_samples,
        settled_now=settled_now,
        quiet=quiet,
        after_settled=cfg.windup_settled_actions,
    )
    wound = (ttft_wind.wound or itl_wind.wound) and "tighten" not in (ttft_how, itl_how)
    wound_detail = ""
    if wound:
        wound_detail = "; wound up: " + ", ".join(
            f"{name} at its bound, observed {attained:.2%} after {w.settled} settled action(s), not above"
            f" {w.reference:.2%} at the bound"
            for name, w, attained in (
                ("TTFT", ttft_wind, t.ttft_attainment_frac),
                ("ITL", itl_wind, t.itl_attainment_frac),
            )
            if w.wound and w.reference is not None and attained is not None
        )
    new = FeedbackState(
        ttft_frac=ttft,
        itl_frac=itl,
        last_at=now,
        capped=state.capped,
        hold_until=hold_until,
        in_flight_at=in_flight_at,
        queued_prefill_tokens=queued_prefill_tokens,
        ttft_relaxed_range=ttft_on,
        itl_relaxed_range=itl_on,
        ttft_windup=ttft_wind,
        itl_windup=itl_wind,
    )
    hows = {ttft_how, itl_how} - {""}
    if not hows and ttft == 0.0 and itl == 0.0:
        return FeedbackUpdate(state=new, reason=None, detail="")
    ttft_applied, itl_applied = ttft, itl
    if aggregated:
        ttft_applied, itl_applied = _applied(ttft, ttft_on, work), _applied(itl, itl_on, work)
    if (ttft_applied, itl_applied) != (ttft, itl):
        hows.add("beyond_range")
    how = next((h for h in _PRIORITY if h in hows), "")
    parts = []
    for name, value, applied, on, attained, samples, moved in (
        ("TTFT", ttft, ttft_applied, ttft_on, t.ttft_attainment_frac, t.ttft_samples_in_window, ttft_how),
        ("ITL", itl, itl_applied, itl_on, t.itl_attainment_frac, t.itl_samples_in_window, itl_how),
    ):
        seen = f"{attained:.2%} of {samples}" if attained is not None and samples is not None else "no observation"
        part = f"{name} headroom {value:+.3f} ({moved or 'held'}; observed {seen})"
        if applied != value and on is not None and work is not None:
            part += (
                f", applied {applied:+.3f} (relaxed on {on.lo_tokens:.0f}..{on.hi_tokens:.0f}-token requests"
                f" +{on.spread_tokens:.0f} spread, {work:.0f} now)"
            )
        parts.append(part)
    detail = f"goal {cfg.attainment_goal:.0%}: " + ", ".join(parts)
    if backlog_draining and "frozen" in hows and not frozen:
        detail += (
            f"; not tightening: the backlog left from before the capacity came drains in"
            f" {draining_s:.0f} s, within a start-up ({startup_s:.0f} s)"
        )
    since_s = now - in_flight_at if in_flight_at is not None else 0.0  # 0.0 is a time, not "none"
    if itl_stale_s is not None:
        detail += (
            f"; not tightening the ITL past the model's own: the requests reported decoded up to {itl_stale_s:.0f} s"
            f" ((OSL p99 - 1) x ITL p99), longer than the {since_s:.0f} s since the capacity came"
        )
    if frozen and "frozen" in hows:
        if in_flight or state.capped or (hold_until is not None and now < hold_until):
            detail += "; not tightening while capacity cannot come (in flight or capped)"
        else:
            detail += (
                f"; not tightening: at least {before:.0%} of the requests reported arrived before the capacity"
                f" came {since_s:.0f} s ago"
            )
    return FeedbackUpdate(
        state=new,
        reason=_REASONS.get(how, Reason.SLA_FEEDBACK_HELD),
        detail=detail,
        ttft_frac=ttft_applied,
        itl_frac=itl_applied,
        wound=wound,
        wound_detail=wound_detail,
    )


def _backlog_drains_in_s(state: FeedbackState, queued: float | None, now: float, dt: float) -> float | None:
    """Seconds until the prefill queue is gone at the rate it fell since the last update; None when it did not fall
    (or either figure is unknown)."""
    before = state.queued_prefill_tokens
    if queued is None or before is None or dt <= 0 or state.last_at is None or not queued < before:
        return None
    if not (math.isfinite(queued) and math.isfinite(before)):
        return None
    rate = (before - queued) / max(now - state.last_at, 1e-9)
    if not rate > 0:  # a fall too small for a float over so long a time (underflow) gives no rate
        return None
    return queued / rate
