"""FPM traffic in sharded mode: each shard counts, the leader differences.

The unsharded service feeds the FPM traffic extension of every stored step sample into the decider's
:class:`~planner.ingest.traffic.TrafficWindows` (``FleetStore.traffic``). In sharded mode the samples stay in the
shards, so:

- each shard's store feeds a :class:`CumulativeTraffic` instead: per service, counters since the shard run started
  (samples that carried the extension; for arrivals, completions, TTFT and ITL the count, sum and fixed log
  buckets). Its summary carries them as :class:`ServiceTraffic` (mergeable: histograms add, and percentiles are
  never sent, since percentiles do not merge). Memory and size are bounded by the buckets seen (at most 641 per
  histogram), never by the sample rate or the uptime;
- the leader's :class:`TrafficDiffer` keeps, per shard run (shard id and ``run_started_at``), the counters it last
  applied; the difference to the shard's newest summary is what that shard ingested in between, added to the
  decider's own windows at the summary's time. The windows, percentiles and attainment the core reads are then
  computed by the same code as unsharded, over every shard's samples (their histograms add in the windows'
  slots), and a lost summary loses nothing (the next difference holds it).

A run the leader first hears after it started itself (a new shard, a restarted one) is counted from its start; a
run already going when the leader started (the leader restarted, or took over) is a baseline: its counters so far
are not added, so the leader's windows start then, as an unsharded service's do after a restart (counted in
``baselined``). Counters that went down within one run (impossible from a shard; a corrupt summary) are a new
baseline too (``resets``). Precision: a sample lands in the leader's window at its summary's time, not its own,
so at most one summary interval late.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import msgspec

from planner.ingest.traffic import Merged, TrafficWindows
from worker_shim.fpm import HIST_MAX_BUCKET, LogHistogram, StepTraffic

if TYPE_CHECKING:
    from planner.shard.summary import ShardSummary

__all__ = ["CumulativeTraffic", "HistogramTotals", "ServiceTraffic", "TrafficDiffer", "check_traffic"]

_Count = Annotated[int, msgspec.Meta(ge=0)]


class HistogramTotals(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """``count`` values summing to ``sum``, by fixed log bucket (:func:`worker_shim.fpm.bucket_index`)."""

    count: _Count
    sum: float
    buckets: dict[int, _Count]


class ServiceTraffic(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One service's traffic counters since the shard run started; ``first_age_s``: how long before the summary
    the shard received the service's first sample with the extension."""

    first_age_s: float
    samples: _Count
    arrivals: HistogramTotals
    completions: HistogramTotals
    ttft_ms: HistogramTotals
    itl_ms: HistogramTotals


_EMPTY = HistogramTotals(0, 0.0, {})
_NO_TRAFFIC = StepTraffic()


def check_traffic(traffic: dict[str, ServiceTraffic]) -> None:
    """``ValueError`` naming the service for counters no shard can send (non-finite, a bucket out of range)."""
    for service, st in traffic.items():
        for name in ("arrivals", "completions", "ttft_ms", "itl_ms"):
            hist: HistogramTotals = getattr(st, name)
            if not math.isfinite(hist.sum) or any(not 0 <= k <= HIST_MAX_BUCKET for k in hist.buckets):
                raise ValueError(f"traffic of service {service!r}: {name} is not a histogram of fixed log buckets")
        if not math.isfinite(st.first_age_s):
            raise ValueError(f"traffic of service {service!r}: first_age_s is not finite")


def _totals(hist: Merged) -> HistogramTotals:
    return HistogramTotals(hist.count, hist.total, dict(hist.buckets)) if hist.count else _EMPTY


class _Counters:
    __slots__ = ("first_s", "hists", "samples")

    def __init__(self, first_s: float) -> None:
        self.first_s = first_s
        self.samples = 0
        self.hists = (Merged(), Merged(), Merged(), Merged())


class CumulativeTraffic(TrafficWindows):
    """A shard's traffic hook (``FleetStore.traffic``): cumulative counters per service, no windows (those are
    the leader's). ``traffic``/``merged`` of the base class read nothing here (None: the windows are the
    leader's); :meth:`totals` is what the summary carries."""

    def __init__(self) -> None:
        super().__init__(window_s=1.0)
        self._counters: dict[str, _Counters] = {}

    def add(self, service: str, traffic: StepTraffic, at_s: float) -> None:
        """One step sample's extension from a worker of ``service``, received at ``at_s`` (the shard's clock)."""
        self.samples += 1  # written by the ingest thread only
        state = self._counters.get(service)
        if state is None:
            with self._lock:
                state = self._counters.setdefault(service, _Counters(at_s))
        state.samples += 1
        if not (traffic.arrivals.count or traffic.completions.count or traffic.ttft_ms.count or traffic.itl_ms.count):
            return  # most steps: nothing happened
        with self._lock:
            h = state.hists
            if traffic.arrivals.count:
                h[0].add(traffic.arrivals)
            if traffic.completions.count:
                h[1].add(traffic.completions)
            if traffic.ttft_ms.count:
                h[2].add(traffic.ttft_ms)
            if traffic.itl_ms.count:
                h[3].add(traffic.itl_ms)

    def services(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._counters)

    def totals(self, now: float) -> dict[str, ServiceTraffic]:
        """Every service's counters so far, ``now`` on the clock ``add`` was given."""
        with self._lock:
            return {
                service: ServiceTraffic(
                    max(now - state.first_s, 0.0),
                    state.samples,
                    *(_totals(h) for h in state.hists),
                )
                for service, state in self._counters.items()
            }


def _minus(cur: HistogramTotals, base: HistogramTotals) -> LogHistogram | None:
    """``cur - base`` as the extension's histogram; None when a counter went down."""
    if base.count == 0:
        return LogHistogram(count=cur.count, sum=cur.sum, buckets=dict(cur.buckets)) if cur.count else LogHistogram()
    if cur.count < base.count:
        return None
    if cur.count == base.count:
        return LogHistogram()  # nothing new (an idle service): the buckets are not walked
    buckets: dict[int, int] = {}
    for k, n in cur.buckets.items():
        d = n - base.buckets.get(k, 0)
        if d < 0:
            return None
        if d:
            buckets[k] = d
    if any(k not in cur.buckets for k in base.buckets):
        return None
    count = cur.count - base.count
    return LogHistogram(count=count, sum=cur.sum - base.sum if count else 0.0, buckets=buckets)


def _difference(cur: ServiceTraffic, base: ServiceTraffic | None) -> tuple[StepTraffic, int] | None:
    """What was added between ``base`` and ``cur`` (the extension, the samples), None when a counter went down."""
    if base is None:
        base = ServiceTraffic(0.0, 0, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    if cur.samples < base.samples:
        return None
    parts = [_minus(c, b) for c, b in zip(_hists(cur), _hists(base), strict=True)]
    if any(p is None for p in parts):
        return None
    arrivals, completions, ttft, itl = (p or LogHistogram() for p in parts)
    return StepTraffic(arrivals=arrivals, completions=completions, ttft_ms=ttft, itl_ms=itl), cur.samples - base.samples


def _hists(st: ServiceTraffic) -> tuple[HistogramTotals, HistogramTotals, HistogramTotals, HistogramTotals]:
    return st.arrivals, st.completions, st.ttft_ms, st.itl_ms


class _Run:
    __slots__ = ("run_started_at", "seq", "taken_at", "totals")

    def __init__(self, run_started_at: float, seq: int, taken_at: float, totals: dict[str, ServiceTraffic]) -> None:
        self.run_started_at = run_started_at
        self.seq = seq
        self.taken_at = taken_at
        self.totals = totals


class TrafficDiffer:
    """The leader's side: each shard run's counters differenced into a :class:`TrafficWindows` (see the module
    docstring). ``started_at``: the leader's wall clock when it started listening (runs that started since are
    counted from their start). Pure: times are arguments."""

    def __init__(self, *, started_at: float) -> None:
        self.started_at = started_at
        self._runs: dict[str, _Run] = {}
        self.applied = 0  # summaries whose traffic was added
        self.baselined = 0  # runs first heard that started before the leader: counted from then on
        self.resets = 0  # services whose counters went down within a run: counted again from then on

    def feed(
        self,
        windows: TrafficWindows,
        summaries: Iterable[ShardSummary],
        *,
        wall_now: float,
        local_now: float,
    ) -> int:
        """Add to ``windows`` what every summary (``ShardSummary``; a version 1 one has no traffic and is
        skipped) holds beyond the last one applied of its run; ``local_now`` is ``wall_now`` on the windows'
        clock. Returns the summaries applied."""
        shift = local_now - wall_now
        known = set(windows.services())
        first_at: dict[str, float] = {}  # services the windows do not know yet -> the earliest first sample
        adds: list[tuple[float, str, StepTraffic, int]] = []
        applied = 0
        for summary in sorted(summaries, key=lambda s: s.taken_at):
            run_started_at = summary.run_started_at
            if run_started_at is None:
                continue  # a version 1 summary: no traffic from this shard
            shard_id, seq, taken_at, totals = summary.shard_id, summary.seq, summary.taken_at, summary.traffic
            prev = self._runs.get(shard_id)
            same_run = prev is not None and prev.run_started_at == run_started_at
            if prev is not None and (
                run_started_at < prev.run_started_at or (same_run and (taken_at, seq) <= (prev.taken_at, prev.seq))
            ):
                continue  # applied already, or an older run's
            at = min(taken_at + shift, local_now)
            baseline = not same_run and run_started_at < self.started_at
            if baseline:
                self.baselined += 1
            for service, cur in totals.items():
                if service not in known:
                    since = at if baseline else at - cur.first_age_s
                    first_at[service] = min(first_at.get(service, since), since)
                if baseline:
                    continue
                base = prev.totals.get(service) if same_run and prev is not None else None
                got = _difference(cur, base)
                if got is None:
                    self.resets += 1
                    continue
                traffic, samples = got
                if samples:
                    adds.append((at, service, traffic, samples))
            self._runs[shard_id] = _Run(run_started_at, seq, taken_at, totals)
            applied += 1
        # services heard for the first time start their windows at their first sample (the rate's span)
        for service, since in sorted(first_at.items(), key=lambda kv: kv[1]):
            windows.add(service, _NO_TRAFFIC, since)
            windows.samples -= 1
        for at, service, traffic, samples in adds:
            windows.add(service, traffic, at)
            windows.samples += samples - 1
        self.applied += applied
        return applied
