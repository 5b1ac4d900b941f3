"""Per-service traffic and observed latency from the FPM traffic extension alone (no frontend, no Prometheus).

Every step sample that carries the extension (:class:`worker_shim.fpm.StepTraffic`) is added with the service
of the worker that sent it and the time it was received; :meth:`TrafficWindows.traffic` reads a sliding window
ending at ``now`` into a :class:`planner.core.Traffic`: arrival rate, ISL (prompt tokens of arrivals) and OSL
(output tokens of completions) mean and p50/p90/p99, observed TTFT and per-request mean ITL p50/p90/p99, and the
fraction of those requests at or under the SLA targets given. Pure: no clock, no I/O; ``now`` is an argument.
Thread-safe (one lock), so the ingest thread can add while the decision thread reads.

Samples are merged on arrival into one-second slots (count, sum and the fixed log buckets of each histogram),
so memory is O(window seconds x distinct buckets) per service, never O(samples). Percentiles are read from the
merged buckets, interpolated geometrically inside the bucket that holds the rank (bucket width 4.4 %; when every
value fell in one bucket the mean is exact and is used). The rate divides by the span the kept slots cover (the window,
plus the part of the oldest second that straddles its start), or by the time since the service's first traffic
sample while the window fills (``window_s`` in the result says which).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping

import msgspec

from planner.core.config import CoreConfig
from planner.core.observation import Traffic
from planner.discovery import Role
from worker_shim.fpm import LogHistogram, StepTraffic, bucket_bounds

__all__ = ["Merged", "TrafficWindows", "attainment", "quantile", "role_traffic", "traffic_to_builtins"]

_FIELDS = ("arrivals", "completions", "ttft_ms", "itl_ms")


class Merged:
    """Histograms merged over samples: count, sum and bucket counts."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.buckets: dict[int, int] = {}

    def add(self, hist: LogHistogram) -> None:
        self.count += hist.count
        self.total += hist.sum
        buckets = self.buckets
        for k, n in hist.buckets.items():
            buckets[k] = buckets.get(k, 0) + n

    def merge(self, other: Merged) -> None:
        self.count += other.count
        self.total += other.total
        buckets = self.buckets
        for k, n in other.buckets.items():
            buckets[k] = buckets.get(k, 0) + n

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def quantile(hist: Merged, q: float) -> float | None:
    """The ``q`` quantile (0..1) of the values merged in ``hist``, None when empty."""
    if hist.count <= 0:
        return None
    if len(hist.buckets) == 1:
        return hist.total / hist.count
    rank = q * hist.count
    seen = 0
    keys = sorted(hist.buckets)
    for k in keys:
        n = hist.buckets[k]
        if seen + n >= rank:
            low, high = bucket_bounds(k)
            frac = min(max((rank - seen) / n, 0.0), 1.0)
            return low + (high - low) * frac if k == 0 else low * (high / low) ** frac
        seen += n
    return bucket_bounds(keys[-1])[1]


def attainment(hist: Merged, target: float) -> float | None:
    """Fraction of the values in ``hist`` at or under ``target``, None when empty."""
    if hist.count <= 0:
        return None
    under = 0.0
    for k, n in hist.buckets.items():
        low, high = bucket_bounds(k)
        if high <= target:
            under += n
        elif low < target:
            frac = (target - low) / (high - low) if k == 0 else math.log(target / low) / math.log(high / low)
            under += n * frac
    return min(under / hist.count, 1.0)


class _Slot:
    __slots__ = ("hists", "second")

    def __init__(self, second: int) -> None:
        self.second = second
        self.hists = tuple(Merged() for _ in _FIELDS)


class _Service:
    __slots__ = ("first_s", "slots")

    def __init__(self, first_s: float) -> None:
        self.first_s = first_s
        self.slots: deque[_Slot] = deque()


class TrafficWindows:
    """Sliding windows of the FPM traffic extension, per service (see the module docstring)."""

    def __init__(self, *, window_s: float = 60.0) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._services: dict[str, _Service] = {}
        self._lock = threading.Lock()
        self.samples = 0  # samples added that carried the extension

    def add(self, service: str, traffic: StepTraffic, at_s: float) -> None:
        """One step sample's extension, received at ``at_s``, from a worker of ``service``."""
        self.samples += 1  # written by the ingest thread only
        if not (traffic.arrivals.count or traffic.completions.count or traffic.ttft_ms.count):
            # an empty extension (most steps): the service reports traffic, nothing happened; no lock once known
            if service not in self._services:
                with self._lock:
                    self._services.setdefault(service, _Service(at_s))
            return
        with self._lock:
            state = self._services.get(service)
            if state is None:
                state = self._services[service] = _Service(at_s)
            second = math.floor(at_s)
            slots = state.slots
            if slots and slots[-1].second >= second:
                slot = slots[-1]  # same second (or a late sample: counted in the newest slot)
            else:
                slot = _Slot(second)
                slots.append(slot)
            h = slot.hists
            if traffic.arrivals.count:
                h[0].add(traffic.arrivals)
            if traffic.completions.count:
                h[1].add(traffic.completions)
            if traffic.ttft_ms.count:
                h[2].add(traffic.ttft_ms)
            if traffic.itl_ms.count:
                h[3].add(traffic.itl_ms)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop every service not in ``keep`` (it is no longer discovered)."""
        keep_set = set(keep)
        with self._lock:
            for name in [s for s in self._services if s not in keep_set]:
                del self._services[name]

    def services(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._services)

    def _read_window_s(self, window_s: float | None) -> float:
        if window_s is None:
            return self.window_s
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        return min(window_s, self.window_s)

    def merged(
        self, service: str, now: float, *, window_s: float | None = None
    ) -> tuple[tuple[Merged, Merged, Merged, Merged], float] | None:
        """The window's merged histograms (arrivals, completions, ttft_ms, itl_ms) and its span in seconds, or
        None for a service that never sent the extension. ``window_s``: read a shorter window than the one kept
        (a role that asks for a shorter one; never longer than what is kept). Evicts slots that left the kept
        window."""
        read_s = self._read_window_s(window_s)
        with self._lock:
            state = self._services.get(service)
            if state is None:
                return None
            slots = state.slots
            while slots and slots[0].second + 1 <= now - self.window_s:
                slots.popleft()
            start = now - read_s
            out = (Merged(), Merged(), Merged(), Merged())
            oldest: float | None = None
            for slot in slots:
                if slot.second > now or slot.second + 1 <= start:
                    continue
                if oldest is None:
                    oldest = float(slot.second)
                for acc, hist in zip(out, slot.hists, strict=True):
                    if hist.count:
                        acc.merge(hist)
            # the slots read cover from the start of the oldest one (up to a second before the window's start)
            covered_from = min(start, oldest) if oldest is not None else start
            span = max(now - max(state.first_s, covered_from), 0.0)
            return out, span

    def traffic(
        self,
        service: str,
        now: float,
        *,
        ttft_target_ms: float | None = None,
        itl_target_ms: float | None = None,
        window_s: float | None = None,
    ) -> Traffic | None:
        """The window ending at ``now`` as core :class:`Traffic`; None for a service that never sent the
        extension (unknown, not zero). Attainment fields are set only when their target is given; ``window_s``
        as in :meth:`merged`."""
        got = self.merged(service, now, window_s=window_s)
        if got is None:
            return None
        (arrivals, completions, ttft, itl), span = got
        rate = arrivals.count / span if span > 0 else None
        return Traffic(
            request_rate_per_s=rate,
            isl_tokens=arrivals.mean,
            osl_tokens=completions.mean,
            isl_tokens_p50=quantile(arrivals, 0.5),
            isl_tokens_p90=quantile(arrivals, 0.9),
            isl_tokens_p99=quantile(arrivals, 0.99),
            osl_tokens_p50=quantile(completions, 0.5),
            osl_tokens_p90=quantile(completions, 0.9),
            osl_tokens_p99=quantile(completions, 0.99),
            ttft_ms_p50=quantile(ttft, 0.5),
            ttft_ms_p90=quantile(ttft, 0.9),
            ttft_ms_p99=quantile(ttft, 0.99),
            itl_ms_p50=quantile(itl, 0.5),
            itl_ms_p90=quantile(itl, 0.9),
            itl_ms_p99=quantile(itl, 0.99),
            ttft_attainment_frac=None if ttft_target_ms is None else attainment(ttft, ttft_target_ms),
            itl_attainment_frac=None if itl_target_ms is None else attainment(itl, itl_target_ms),
            ttft_samples_in_window=ttft.count,
            itl_samples_in_window=itl.count,
            requests_in_window=arrivals.count,
            window_s=span,
        ).clean()

    def all(
        self,
        now: float,
        *,
        targets_ms: Mapping[str, tuple[float | None, float | None]] | None = None,
    ) -> dict[str, Traffic]:
        """:meth:`traffic` of every service; ``targets_ms``: (ttft, itl) targets by service."""
        out: dict[str, Traffic] = {}
        for service in self.services():
            ttft_t, itl_t = (targets_ms or {}).get(service, (None, None))
            got = self.traffic(service, now, ttft_target_ms=ttft_t, itl_target_ms=itl_t)
            if got is not None:
                out[service] = got
        return out


def traffic_to_builtins(traffic: Traffic) -> dict[str, object]:
    """A :class:`Traffic` as a JSON-ready dict without the unknown (None) fields."""
    return {k: v for k, v in msgspec.structs.asdict(traffic).items() if v is not None}


def role_traffic(
    windows: TrafficWindows, services: Mapping[Role, str], now: float, config: CoreConfig | None = None
) -> dict[Role, Traffic]:
    """``Observation.traffic`` from the FPM extension: the window of each role's service, over the role's own
    ``traffic_window_s`` in ``config`` (the windows keep the longest any role asks for), attainment against the
    role's SLA targets in ``config`` (none without it; without a config, the windows' own span). A role whose
    service never sent the extension is left out (unknown, not zero). The service and the replay's "ours" both
    call this."""
    out: dict[Role, Traffic] = {}
    for role, service in services.items():
        role_config = config.roles.get(role) if config is not None else None
        sla = role_config.sla if role_config is not None else None
        got = windows.traffic(
            service,
            now,
            ttft_target_ms=None if sla is None else sla.ttft_ms,
            itl_target_ms=None if sla is None else sla.itl_ms,
            window_s=None if role_config is None else role_config.traffic_window_s,
        )
        if got is not None:
            out[role] = got
    return out
