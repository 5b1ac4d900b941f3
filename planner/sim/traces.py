"""Request traces for replay: Azure LLM inference trace 2023 (CSV: ``TIMESTAMP, ContextTokens,
GeneratedTokens``) and Mooncake (JSONL: ``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``).

A :class:`Trace` holds numpy columns sorted by arrival time, seconds from the first request. :func:`scale_rate`
multiplies the request rate while keeping the duration (each request is replayed ``K`` times on average, copies
spread uniformly over the inter-arrival gap and given distinct prefix-cache ids); :func:`compress_time` replays
the same requests faster. Bad input raises :class:`~planner.errors.ConfigError` naming the file and line.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import msgspec
import numpy as np

from planner.errors import ConfigError

__all__ = [
    "Trace",
    "compress_time",
    "load_trace",
    "read_azure_csv",
    "read_mooncake_jsonl",
    "scale_rate",
    "synthetic_trace",
]


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    """Requests sorted by ``arrival_s``; ``hash_ids[i]`` is a tuple of prefix-block ids or None."""

    name: str
    arrival_s: np.ndarray  # float64
    isl: np.ndarray  # int64
    osl: np.ndarray  # int64
    hash_ids: tuple[tuple[int, ...] | None, ...]

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def _make(
    name: str,
    arrival: list[float],
    isl: list[int],
    osl: list[int],
    hashes: list[tuple[int, ...] | None],
    *,
    rebase: bool = True,
) -> Trace:
    if not arrival:
        raise ConfigError(f"trace {name}: no requests")
    a = np.asarray(arrival, dtype=float)
    order = np.argsort(a, kind="stable")
    a = a[order] - (a[order[0]] if rebase else 0.0)
    return Trace(
        name=name,
        arrival_s=a,
        isl=np.asarray(isl, dtype=np.int64)[order],
        osl=np.asarray(osl, dtype=np.int64)[order],
        hash_ids=tuple(hashes[i] for i in order),
    )


def read_azure_csv(path: str | Path) -> Trace:
    path = Path(path)
    arrival: list[float] = []
    isl: list[int] = []
    osl: list[int] = []
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
            if missing:
                raise ConfigError(f"{path}: missing columns {sorted(missing)}")
            for line, row in enumerate(reader, start=2):
                try:
                    stamp = row["TIMESTAMP"].strip()
                    when = dt.datetime.fromisoformat(stamp[:26] if "." in stamp else stamp)
                    arrival.append(when.timestamp())
                    isl.append(int(row["ContextTokens"]))
                    osl.append(int(row["GeneratedTokens"]))
                except (ValueError, TypeError, AttributeError) as exc:
                    raise ConfigError(f"{path}:{line}: bad row {row!r}: {exc}") from exc
                if isl[-1] < 0 or osl[-1] < 0:
                    raise ConfigError(f"{path}:{line}: negative token count")
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from exc
    return _make(path.name, arrival, isl, osl, [None] * len(arrival))


class _MooncakeRow(msgspec.Struct):
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] = []


def read_mooncake_jsonl(path: str | Path) -> Trace:
    path = Path(path)
    decoder = msgspec.json.Decoder(_MooncakeRow)
    arrival: list[float] = []
    isl: list[int] = []
    osl: list[int] = []
    hashes: list[tuple[int, ...] | None] = []
    try:
        with path.open("rb") as fh:
            for line, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    row = decoder.decode(raw)
                except msgspec.DecodeError as exc:
                    raise ConfigError(f"{path}:{line}: {exc}") from exc
                if row.input_length < 0 or row.output_length < 0:
                    raise ConfigError(f"{path}:{line}: negative token count")
                arrival.append(row.timestamp / 1000.0)
                isl.append(row.input_length)
                osl.append(row.output_length)
                hashes.append(tuple(row.hash_ids) if row.hash_ids else None)
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from exc
    return _make(path.name, arrival, isl, osl, hashes)


def load_trace(path: str | Path) -> Trace:
    """By extension: ``.csv`` Azure, ``.jsonl`` / ``.json`` Mooncake."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return read_azure_csv(path)
    if suffix in (".jsonl", ".json"):
        return read_mooncake_jsonl(path)
    raise ConfigError(f"{path}: unknown trace format (expected .csv Azure or .jsonl Mooncake)")


def scale_rate(trace: Trace, factor: float, *, seed: int = 0, shift_s: float = 60.0) -> Trace:
    """``factor`` times the request rate over the same duration: the trace superposed with itself, as if
    ``factor`` independent user populations with the same traffic shape shared the fleet.

    Copy 0 is the trace itself; copy ``j`` (``j < floor(factor)``) is the whole trace shifted by one random
    offset drawn uniformly in ``[-shift_s/2, shift_s/2]`` (wrapped around the trace's duration), so the load's
    shape at scales above ``shift_s`` is kept while second-scale bursts of different populations do not line up;
    a fractional part adds one more shifted copy thinned to that fraction. ``shift_s = 0`` lines the copies up
    exactly (every burst multiplied by ``factor``: the adversarial case). Copies get distinct prefix-cache
    ids (other users do not share your prompts)."""
    if not factor > 0:
        raise ConfigError(f"rate scale must be > 0, got {factor}")
    if shift_s < 0:
        raise ConfigError(f"shift_s must be >= 0, got {shift_s}")
    if factor == 1.0:
        return trace
    rng = np.random.default_rng(seed)
    n = len(trace)
    whole = int(np.floor(factor))
    frac = factor - whole
    span = trace.duration_s + (trace.duration_s / max(n - 1, 1))
    top = 1 + max((max(h) for h in trace.hash_ids if h), default=0)
    arrivals: list[np.ndarray] = []
    index: list[np.ndarray] = []
    copy_of: list[int] = []
    for j in range(whole + (1 if frac > 0 else 0)):
        keep = np.arange(n) if j < whole else np.flatnonzero(rng.random(n) < frac)
        offset = 0.0 if j == 0 else float(rng.uniform(-shift_s / 2.0, shift_s / 2.0))
        at = trace.arrival_s[keep] + offset
        if span > 0:
            at = np.mod(at, span)
        arrivals.append(at)
        index.append(keep)
        copy_of.extend([j] * keep.shape[0])
    idx = np.concatenate(index)
    hashes: list[tuple[int, ...] | None] = []
    for i, j in zip(idx.tolist(), copy_of, strict=True):
        h = trace.hash_ids[i]
        hashes.append(h if (h is None or j == 0) else tuple(x + j * top for x in h))
    return _make(
        f"{trace.name} x{factor:g}",
        np.concatenate(arrivals).tolist(),
        trace.isl[idx].tolist(),
        trace.osl[idx].tolist(),
        hashes,
        rebase=False,
    )


def compress_time(trace: Trace, factor: float) -> Trace:
    """Replay ``factor`` times faster (arrival times divided by ``factor``)."""
    if not factor > 0:
        raise ConfigError(f"time compression must be > 0, got {factor}")
    return msgspec.structs.replace(trace, arrival_s=trace.arrival_s / factor, name=f"{trace.name} /{factor:g}t")


def synthetic_trace(
    *, rate_per_s: list[tuple[float, float]], isl: int, osl: int, seed: int = 0, name: str = "synthetic"
) -> Trace:
    """Poisson arrivals: ``rate_per_s`` is a list of ``(duration_s, rate)`` phases; fixed ISL and OSL."""
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    start = 0.0
    for duration_s, rate in rate_per_s:
        if rate > 0:
            count = rng.poisson(rate * duration_s)
            arrivals.extend(sorted((start + rng.random(count) * duration_s).tolist()))
        start += duration_s
    if not arrivals:
        raise ConfigError("synthetic trace has no requests")
    return Trace(
        name=name,
        arrival_s=np.asarray(arrivals, dtype=float),
        isl=np.full(len(arrivals), isl, dtype=np.int64),
        osl=np.full(len(arrivals), osl, dtype=np.int64),
        hash_ids=(None,) * len(arrivals),
    )
