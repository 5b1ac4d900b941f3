"""Trace replay: run one policy (or the hindsight oracle) over a trace on a simulated fleet.

The driver walks arrivals in time order; every ``policy.tick_s`` of simulated time it lets engines send idle
heartbeats, hands the policy the fleet and the last tick's traffic, and samples the timeline. After the last
arrival it keeps ticking until every request has finished (at most ``drain_s``). Every policy (and the oracle)
is billed over the same span, from the first arrival to the later of the last request's finish and the trace's
end (:func:`billing_end_s`), whatever its tick.

* :func:`run_policy` — one policy, one fleet.
* :func:`run_oracle` — per window of ``window_s``, the fewest replicas (instantly ready, fresh fleet) whose
  replay of that window's requests meets the attainment target; GPU-hours = sum of count x window.
* :func:`find_fixed_peak` — the smallest constant count whose whole-trace replay meets the target (runs stop
  early once the misses already exceed what the target allows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import msgspec
import numpy as np

from planner.sim.engine import SimRequest
from planner.sim.fleet import FleetConfig, ReplicaState, SimFleet
from planner.sim.metrics import Outcomes, SlaConfig, TimelinePoint
from planner.sim.policies import FixedPolicy, Policy, TickTraffic
from planner.sim.timing import StepTimer
from planner.sim.traces import Trace

__all__ = [
    "OracleResult",
    "RunResult",
    "billing_end_s",
    "feasible_mask",
    "find_fixed_peak",
    "isolated_ttft_s",
    "run_oracle",
    "run_policy",
]

Progress = Callable[[str, float], None]  # (label, fraction done)


class RunResult:
    def __init__(
        self,
        name: str,
        outcomes: Outcomes,
        gpu_hours: float,
        fleet: SimFleet,
        timeline: list[TimelinePoint],
        wall_s: float,
        aborted: bool,
    ) -> None:
        self.name = name
        self.outcomes = outcomes
        self.gpu_hours = gpu_hours
        self.fleet = fleet
        self.events = list(fleet.scale_events)
        self.timeline = timeline
        self.wall_s = wall_s
        self.aborted = aborted


class OracleResult(msgspec.Struct, kw_only=True):
    window_s: float
    replicas: list[int]  # per window
    gpu_hours: float
    wall_s: float


def isolated_ttft_s(timer: StepTimer, isl: int, chunk: int, overhead_s: float) -> float:
    """TTFT of a request alone on an idle engine (chunked prefill)."""
    done = 0
    total = 0.0
    while done < isl:
        c = min(chunk, isl - done)
        total += timer.step_time_s(c, done, 0, 0)
        done += c
    return total + overhead_s


def feasible_mask(trace: Trace, timer: StepTimer, fleet_config: FleetConfig, sla: SlaConfig) -> np.ndarray:
    """Requests some policy could serve within the SLA: not over ``max_model_len`` and prefill alone on an idle
    engine within ``ttft_ms``."""
    eng = fleet_config.engine
    memo: dict[int, float] = {}
    out = np.ones(len(trace), dtype=bool)
    for i, (isl, osl) in enumerate(zip(trace.isl.tolist(), trace.osl.tolist(), strict=True)):
        if isl + osl > eng.max_model_len:
            out[i] = False
            continue
        t = memo.get(isl)
        if t is None:
            t = memo[isl] = isolated_ttft_s(timer, isl, eng.max_num_batched_tokens, eng.ttft_overhead_s)
        out[i] = t * 1000.0 <= sla.ttft_ms
    return out


def _collect(outcomes: Outcomes, sla: SlaConfig) -> tuple[Callable[[SimRequest], None], list[int]]:
    misses = [0]
    ttft_limit = sla.ttft_ms / 1000.0
    itl_limit = sla.itl_ms / 1000.0

    def on_finish(req: SimRequest) -> None:
        ttft = req.ttft_s
        itl = req.itl_s
        rid = req.rid
        outcomes.ttft_s[rid] = ttft
        outcomes.itl_s[rid] = itl
        outcomes.finish_s[rid] = req.finish_s
        outcomes.preemptions += req.preemptions
        if ttft is None or itl is None or ttft > ttft_limit or itl > itl_limit:
            if outcomes.feasible[rid]:
                misses[0] += 1

    return on_finish, misses


def run_policy(
    trace: Trace,
    policy: Policy,
    *,
    fleet_config: FleetConfig,
    timer: StepTimer,
    sla: SlaConfig,
    feasible: np.ndarray,
    initial_replicas: int,
    drain_s: float = 900.0,
    max_misses: int | None = None,
    progress: Progress | None = None,
    indices: tuple[int, int] | None = None,
    name: str | None = None,
) -> RunResult:
    """Replay ``trace`` (or the slice ``indices``) under ``policy``; every role starts with
    ``initial_replicas`` ready replicas. With ``max_misses`` the run stops (``aborted``) once more feasible
    requests than that have missed the SLA."""
    started = time.perf_counter()
    label = name or policy.name
    lo, hi = indices if indices is not None else (0, len(trace))
    outcomes = Outcomes(len(trace), feasible)
    on_finish, misses = _collect(outcomes, sla)
    fleet = SimFleet(fleet_config, timer, sink=policy.make_sink(), on_finish=on_finish, name=label)
    t0 = float(trace.arrival_s[lo]) if hi > lo else 0.0
    for role in fleet_config.roles:
        fleet.scale(role, initial_replicas, t0, instant=True)
    fleet.scale_events.clear()
    policy.attach(fleet)
    arrival = trace.arrival_s
    isl = trace.isl.tolist()
    osl = trace.osl.tolist()
    hashes = trace.hash_ids
    tick_s = policy.tick_s
    next_tick = t0 + tick_s
    timeline: list[TimelinePoint] = []
    tick_arrivals = 0
    tick_isl = 0
    tick_osl = 0
    last_finished = 0
    arrival_list = arrival[lo:hi].tolist()
    total = max(hi - lo, 1)
    report_every = max(total // 200, 1)
    aborted = False

    def do_tick(now: float) -> None:
        nonlocal tick_arrivals, tick_isl, tick_osl, last_finished
        fleet.heartbeat(now)
        traffic = TickTraffic(
            request_rate_per_s=tick_arrivals / tick_s,
            isl_tokens=tick_isl / tick_arrivals if tick_arrivals else None,
            osl_tokens=tick_osl / tick_arrivals if tick_arrivals else None,
        )
        policy.tick(fleet, now, traffic)
        ready = 0
        for role in fleet_config.roles:
            ready += fleet.counts(role)[ReplicaState.READY]
        timeline.append(
            TimelinePoint(
                at_s=now,
                replicas=fleet.total_replicas(),
                ready=ready,
                arrivals_per_s=traffic.request_rate_per_s,
                ttft_p99_ms=None,
                itl_p99_ms=None,
            )
        )
        tick_arrivals = tick_isl = tick_osl = 0

    for k, at in enumerate(arrival_list):
        i = lo + k
        while next_tick <= at:
            fleet.run_until(next_tick)
            do_tick(next_tick)
            next_tick += tick_s
        fleet.submit(SimRequest(i, at, isl[i], osl[i], hashes[i]), at)
        tick_arrivals += 1
        tick_isl += isl[i]
        tick_osl += osl[i]
        if k % report_every == 0:
            if progress is not None:
                progress(label, k / total)
            if max_misses is not None and misses[0] > max_misses:
                aborted = True
                break
    end_limit = (arrival_list[-1] if arrival_list else t0) + drain_s
    if not aborted:
        while next_tick <= end_limit:
            fleet.run_until(next_tick)
            if all(r.engine.idle for reps in fleet.replicas.values() for r in reps) and not fleet.pending_transfers:
                break
            do_tick(next_tick)
            next_tick += tick_s
    end = fleet.now
    gpu_hours = fleet.gpu_hours_between(t0, billing_end_s(trace, outcomes, lo, hi, fleet))
    fleet.close(end)
    if progress is not None:
        progress(label, 1.0)
    _fill_latency_timeline(timeline, outcomes, arrival, tick_s)
    return RunResult(label, outcomes, gpu_hours, fleet, timeline, time.perf_counter() - started, aborted)


def billing_end_s(trace: Trace, outcomes: Outcomes, lo: int, hi: int, fleet: SimFleet | None = None) -> float:
    """End of the span every policy is billed over: the later of the last request's finish and the trace's end
    (its last arrival), for the requests ``[lo, hi)``. Requests still in ``fleet`` when the run stopped (it gave
    up on them) extend it to the fleet's clock: their GPUs were held until then."""
    if hi <= lo:
        return float(trace.arrival_s[lo]) if lo < len(trace) else trace.duration_s
    end = float(trace.arrival_s[hi - 1])
    finish = outcomes.finish_s[lo:hi]
    done = finish[np.isfinite(finish)]
    if done.size:
        end = max(end, float(done.max()))
    if fleet is not None and done.size < finish.size:
        if any(not r.engine.idle for reps in fleet.replicas.values() for r in reps) or fleet.pending_transfers:
            end = max(end, fleet.now)
    return end


def _fill_latency_timeline(
    timeline: list[TimelinePoint], outcomes: Outcomes, arrival: np.ndarray, tick_s: float
) -> None:
    """p99 TTFT / ITL of the requests that arrived during each tick."""
    if not timeline:
        return
    edges = np.asarray([p.at_s for p in timeline])
    slot = np.searchsorted(edges, arrival, side="left")
    for j, point in enumerate(timeline):
        sel = slot == j
        ttft = outcomes.ttft_s[sel]
        itl = outcomes.itl_s[sel]
        ttft = ttft[np.isfinite(ttft)]
        itl = itl[np.isfinite(itl)]
        timeline[j] = msgspec.structs.replace(
            point,
            ttft_p99_ms=float(np.percentile(ttft, 99)) * 1000.0 if ttft.size else None,
            itl_p99_ms=float(np.percentile(itl, 99)) * 1000.0 if itl.size else None,
        )


def run_oracle(
    trace: Trace,
    *,
    fleet_config: FleetConfig,
    timer: StepTimer,
    sla: SlaConfig,
    feasible: np.ndarray,
    window_s: float = 60.0,
    max_replicas: int = 256,
    progress: Progress | None = None,
) -> tuple[OracleResult, Outcomes]:
    """Hindsight oracle (see module docstring). Each window is searched from the previous window's count:
    down while the target is still met, up until it is."""
    started = time.perf_counter()
    outcomes = Outcomes(len(trace), feasible)
    edges = np.arange(0.0, trace.duration_s + window_s, window_s)
    bounds = [*np.searchsorted(trace.arrival_s, edges, side="left").tolist(), len(trace)]
    per_window: list[int] = []
    guess = 1
    roles = len(fleet_config.roles)
    n_windows = len(edges)

    def attempt(lo: int, hi: int, n: int) -> tuple[bool, RunResult]:
        count = int(feasible[lo:hi].sum())
        allowed = math.floor(count * (1.0 - sla.attainment_target) + 1e-9)
        res = run_policy(
            trace,
            FixedPolicy(n, tick_s=window_s),
            fleet_config=fleet_config,
            timer=timer,
            sla=sla,
            feasible=feasible,
            initial_replicas=n,
            max_misses=allowed,
            indices=(lo, hi),
            name="oracle",
            drain_s=3600.0,
        )
        if res.aborted:
            return False, res
        met = res.outcomes.met(sla)[lo:hi] & feasible[lo:hi]
        return int(met.sum()) >= count - allowed, res

    for w in range(n_windows):
        lo, hi = bounds[w], bounds[w + 1]
        if progress is not None:
            progress("oracle", w / n_windows)
        if hi <= lo:
            per_window.append(1)
            continue
        n = max(1, guess)
        ok, best = attempt(lo, hi, n)
        if ok:
            while n > 1:
                ok_down, res_down = attempt(lo, hi, n - 1)
                if not ok_down:
                    break
                n -= 1
                best = res_down
        else:
            while n < max_replicas and not ok:
                n += 1
                ok, best = attempt(lo, hi, n)
        per_window.append(n)
        guess = n
        sl = slice(lo, hi)
        outcomes.ttft_s[sl] = best.outcomes.ttft_s[sl]
        outcomes.itl_s[sl] = best.outcomes.itl_s[sl]
        outcomes.finish_s[sl] = best.outcomes.finish_s[sl]
        outcomes.preemptions += best.outcomes.preemptions
    gpus = fleet_config.gpus_per_replica * roles
    # Billed over the span every policy is billed over (first arrival to the later of the last finish and the
    # trace's end): each window's count over the part of the window inside that span.
    start_s = float(trace.arrival_s[0]) if len(trace) else 0.0
    end_s = billing_end_s(trace, outcomes, 0, len(trace))
    busy = [w for w in range(len(per_window)) if bounds[w + 1] > bounds[w]]
    last_busy = busy[-1] if busy else -1
    gpu_seconds = 0.0
    for w, n in enumerate(per_window[: last_busy + 1]):
        lo_s = max(float(edges[w]), start_s)
        # the last window with requests holds its replicas until they have all finished, however long that takes
        hi_s = end_s if w == last_busy else min(float(edges[w]) + window_s, end_s)
        gpu_seconds += n * max(hi_s - lo_s, 0.0)
    gpu_hours = gpu_seconds * gpus / 3600.0
    if progress is not None:
        progress("oracle", 1.0)
    return (
        OracleResult(window_s=window_s, replicas=per_window, gpu_hours=gpu_hours, wall_s=time.perf_counter() - started),
        outcomes,
    )


def find_fixed_peak(
    trace: Trace,
    *,
    fleet_config: FleetConfig,
    timer: StepTimer,
    sla: SlaConfig,
    feasible: np.ndarray,
    start: int,
    low: int = 1,
    max_replicas: int = 256,
    progress: Progress | None = None,
) -> tuple[int, RunResult]:
    """Smallest constant replica count meeting the attainment target over the whole trace: ``start`` (doubled
    until it meets the target) bounds it from above, then bisection down to ``low`` (attainment grows with the
    count). Runs that cannot meet the target stop as soon as their misses exceed the allowance."""
    count = int(feasible.sum())
    allowed = math.floor(count * (1.0 - sla.attainment_target) + 1e-9)

    def attempt(n: int) -> tuple[bool, RunResult]:
        res = run_policy(
            trace,
            FixedPolicy(n),
            fleet_config=fleet_config,
            timer=timer,
            sla=sla,
            feasible=feasible,
            initial_replicas=n,
            max_misses=allowed,
            progress=progress,
            name="fixed",
        )
        if res.aborted:
            return False, res
        return int((res.outcomes.met(sla) & feasible).sum()) >= count - allowed, res

    hi = max(1, start)
    ok, best = attempt(hi)
    lo = max(1, min(low, hi))
    while not ok and hi < max_replicas:
        lo = hi + 1
        hi = min(max_replicas, hi * 2)
        ok, best = attempt(hi)
    if not ok:
        return hi, best
    while lo < hi:
        mid = (lo + hi) // 2
        ok_mid, res_mid = attempt(mid)
        if ok_mid:
            hi, best = mid, res_mid
        else:
            lo = mid + 1
    return hi, best
