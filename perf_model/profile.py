"""Measured engine profiles on disk: the format of ``shared/data/profiles/<name>/``.

A profile directory holds

- ``prefill.csv``: ``isl_tokens, ttft_ms[, ...]``: one prefill of ``isl_tokens`` alone on one engine;
- ``decode.csv``: ``kv_usage_fraction, context_length_tokens, itl_ms[, throughput_tokens_per_s_per_gpu]``:
  steady decode of sequences of ``context_length_tokens`` filling ``kv_usage_fraction`` of the KV cache;
- ``README.md`` (optional) naming the engine's KV capacity as ``max_kv_tokens = N``.

Each decode point is turned into the engine-step terms FPM reports (``num_decode_requests``,
``sum_decode_kv_tokens``): the batch actually decoding is, by Little's law, ``throughput * ITL`` (one token
per request per step), which is what the engine achieved, not what the profiler asked for (at short contexts
and high KV fractions the engine ran fewer sequences than ``kv_usage_fraction * max_kv_tokens / context``).
Without a throughput column the requested batch is used, which needs ``max_kv_tokens``.

Bad input raises :class:`~perf_model.errors.ProfileError` naming the file, the row and the field.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from pathlib import Path

import msgspec

from perf_model.errors import ProfileError

__all__ = ["DecodePoint", "MeasuredProfile", "PrefillPoint", "load_profile"]

_MAX_KV = re.compile(r"max_kv_tokens\s*=\s*([0-9][0-9_,]*)")


class PrefillPoint(msgspec.Struct, frozen=True, kw_only=True):
    isl_tokens: float
    ttft_ms: float


class DecodePoint(msgspec.Struct, frozen=True, kw_only=True):
    context_length_tokens: float
    kv_usage_fraction: float
    itl_ms: float
    decode_requests: float  # batch the engine decoded (throughput * ITL, or the requested batch)
    decode_kv_tokens: float  # decode_requests * context_length_tokens


class MeasuredProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    prefill: tuple[PrefillPoint, ...]  # sorted by isl_tokens
    decode: tuple[DecodePoint, ...]  # sorted by (context_length_tokens, decode_requests)
    max_kv_tokens: int | None


def _number(path: Path, row_no: int, row: dict[str, str], field: str, *, positive: bool) -> float:
    raw = row.get(field)
    if raw is None or raw.strip() == "":
        raise ProfileError(f"{path}: row {row_no}: field '{field}' is missing")
    try:
        value = float(raw)
    except ValueError as exc:
        raise ProfileError(f"{path}: row {row_no}: field '{field}' is not a number: {raw!r}") from exc
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise ProfileError(f"{path}: row {row_no}: field '{field}' must be a finite {kind} number, got {raw!r}")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = tuple(reader.fieldnames or ())
            missing = [f for f in required if f not in header]
            if missing:
                raise ProfileError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
            rows = [(i, row) for i, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc}") from exc
    except csv.Error as exc:
        raise ProfileError(f"{path}: not a CSV file: {exc}") from exc
    if not rows:
        raise ProfileError(f"{path}: no data rows")
    return rows


def _max_kv_tokens(directory: Path) -> int | None:
    readme = directory / "README.md"
    if not readme.is_file():
        return None
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read {readme}: {exc}") from exc
    match = _MAX_KV.search(text)
    if match is None:
        return None
    value = int(match.group(1).replace("_", "").replace(",", ""))
    if value <= 0:
        raise ProfileError(f"{readme}: max_kv_tokens must be positive, got {value}")
    return value


def load_profile(directory: str | Path, *, max_kv_tokens: int | None = None) -> MeasuredProfile:
    """Read a profile directory. ``max_kv_tokens`` overrides the README's value."""
    root = Path(directory)
    if not root.is_dir():
        raise ProfileError(f"profile directory {root} does not exist")
    kv_cap = max_kv_tokens if max_kv_tokens is not None else _max_kv_tokens(root)
    if kv_cap is not None and kv_cap <= 0:
        raise ProfileError(f"max_kv_tokens must be positive, got {kv_cap}")

    prefill_path = root / "prefill.csv"
    prefill: list[PrefillPoint] = []
    for row_no, row in _rows(prefill_path, ("isl_tokens", "ttft_ms")):
        prefill.append(
            PrefillPoint(
                isl_tokens=_number(prefill_path, row_no, row, "isl_tokens", positive=True),
                ttft_ms=_number(prefill_path, row_no, row, "ttft_ms", positive=True),
            )
        )
    prefill.sort(key=lambda p: p.isl_tokens)
    for a, b in itertools.pairwise(prefill):
        if a.isl_tokens == b.isl_tokens:
            raise ProfileError(f"{prefill_path}: isl_tokens {a.isl_tokens:g} appears twice")

    decode_path = root / "decode.csv"
    decode_rows = _rows(decode_path, ("kv_usage_fraction", "context_length_tokens", "itl_ms"))
    has_throughput = "throughput_tokens_per_s_per_gpu" in decode_rows[0][1]
    if not has_throughput and kv_cap is None:
        raise ProfileError(
            f"{decode_path}: without a throughput_tokens_per_s_per_gpu column the decode batch is "
            f"kv_usage_fraction * max_kv_tokens / context_length_tokens, so max_kv_tokens is needed "
            f"(in {root / 'README.md'} as 'max_kv_tokens = N', or passed explicitly)"
        )
    decode: list[DecodePoint] = []
    for row_no, row in decode_rows:
        ctx = _number(decode_path, row_no, row, "context_length_tokens", positive=True)
        kv_frac = _number(decode_path, row_no, row, "kv_usage_fraction", positive=False)
        itl_ms = _number(decode_path, row_no, row, "itl_ms", positive=True)
        if kv_frac > 1.0:
            raise ProfileError(f"{decode_path}: row {row_no}: kv_usage_fraction must be at most 1, got {kv_frac:g}")
        if has_throughput:
            thr = _number(decode_path, row_no, row, "throughput_tokens_per_s_per_gpu", positive=True)
            batch = thr * itl_ms / 1000.0
        elif kv_cap is not None:
            batch = kv_frac * kv_cap / ctx
        else:  # unreachable: checked before the loop
            raise ProfileError(f"{decode_path}: max_kv_tokens is needed")
        batch = max(batch, 1.0)
        decode.append(
            DecodePoint(
                context_length_tokens=ctx,
                kv_usage_fraction=kv_frac,
                itl_ms=itl_ms,
                decode_requests=batch,
                decode_kv_tokens=batch * ctx,
            )
        )
    decode.sort(key=lambda d: (d.context_length_tokens, d.decode_requests))
    return MeasuredProfile(name=root.name, prefill=tuple(prefill), decode=tuple(decode), max_kv_tokens=kv_cap)
