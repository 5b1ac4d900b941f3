"""Measured-profile loading at its edges, row by row: which numbers each field accepts (zero is fine for a KV
fraction, never for a length, a time or a throughput), the exact error naming file, row and field, the README's
KV capacity with separators, and what the decode points hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from perf_model.errors import ProfileError
from perf_model.profile import DecodePoint, load_profile

PREFILL = "isl_tokens,ttft_ms\n100,10\n1000,40\n"
DECODE_THR = "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n0.5,1000,20,4000\n"


@dataclass
class Bad:
    name: str
    prefill: str
    decode: str
    message: str  # the whole message after the file's path


BAD = [
    Bad(
        "a zero ISL",
        "isl_tokens,ttft_ms\n0,10\n",
        DECODE_THR,
        "row 2: field 'isl_tokens' must be a finite positive number, got '0'",
    ),
    Bad(
        "a zero TTFT",
        "isl_tokens,ttft_ms\n100,0\n",
        DECODE_THR,
        "row 2: field 'ttft_ms' must be a finite positive number, got '0'",
    ),
    Bad(
        "an infinite TTFT",
        "isl_tokens,ttft_ms\n100,inf\n",
        DECODE_THR,
        "row 2: field 'ttft_ms' must be a finite positive number, got 'inf'",
    ),
    Bad(
        "a negative KV fraction",
        PREFILL,
        "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n-0.1,1000,20,4000\n",
        "row 2: field 'kv_usage_fraction' must be a finite non-negative number, got '-0.1'",
    ),
    Bad(
        "a zero context",
        PREFILL,
        "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n0.5,0,20,4000\n",
        "row 2: field 'context_length_tokens' must be a finite positive number, got '0'",
    ),
    Bad(
        "a zero ITL",
        PREFILL,
        "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n0.5,1000,0,4000\n",
        "row 2: field 'itl_ms' must be a finite positive number, got '0'",
    ),
    Bad(
        "a zero throughput on the third row",
        PREFILL,
        "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n0.5,1000,20,4000\n0.5,2000,20,0\n",
        "row 3: field 'throughput_tokens_per_s_per_gpu' must be a finite positive number, got '0'",
    ),
    Bad("an empty field", "isl_tokens,ttft_ms\n100,\n", DECODE_THR, "row 2: field 'ttft_ms' is missing"),
]


@pytest.mark.parametrize("row", BAD, ids=[r.name for r in BAD])
def test_bad_numbers_are_named(tmp_path: Path, write_profile: Callable[..., Path], row: Bad) -> None:
    root = write_profile(tmp_path / "p", row.prefill, row.decode, None)
    with pytest.raises(ProfileError) as info:
        load_profile(root)
    path = root / ("prefill.csv" if row.prefill is not PREFILL else "decode.csv")
    assert str(info.value) == f"{path}: {row.message}"


def test_a_zero_kv_fraction_is_accepted_and_points_hold_what_was_measured(
    tmp_path: Path, write_profile: Callable[..., Path]
) -> None:
    decode = (
        "kv_usage_fraction,context_length_tokens,itl_ms,throughput_tokens_per_s_per_gpu\n"
        "0.5,2000,20,4000\n"  # Little's law: 4000 tokens/s x 20 ms = 80 sequences
        "0,1000,10,50\n"  # 0.5 sequences measured: at least one is decoding
    )
    profile = load_profile(write_profile(tmp_path / "p", PREFILL, decode, None))
    assert profile.decode == (
        DecodePoint(
            context_length_tokens=1000, kv_usage_fraction=0.0, itl_ms=10, decode_requests=1.0, decode_kv_tokens=1000
        ),
        DecodePoint(
            context_length_tokens=2000, kv_usage_fraction=0.5, itl_ms=20, decode_requests=80.0, decode_kv_tokens=160_000
        ),
    )
    assert [(p.isl_tokens, p.ttft_ms) for p in profile.prefill] == [(100, 10), (1000, 40)]
    assert profile.max_kv_tokens is None


@pytest.mark.parametrize(
    ("readme", "expected"),
    [
        ("max_kv_tokens = 1_000_000", 1_000_000),
        ("KV: max_kv_tokens=2,500,000 tokens", 2_500_000),
        ("nothing here", None),
    ],
)
def test_the_readme_names_the_kv_capacity(
    tmp_path: Path, write_profile: Callable[..., Path], readme: str, expected: int | None
) -> None:
    assert load_profile(write_profile(tmp_path / "p", PREFILL, DECODE_THR, readme)).max_kv_tokens == expected


def test_a_zero_kv_capacity_is_refused(tmp_path: Path, write_profile: Callable[..., Path]) -> None:
    root = write_profile(tmp_path / "p", PREFILL, DECODE_THR, "max_kv_tokens = 0")
    with pytest.raises(ProfileError, match="max_kv_tokens must be positive, got 0"):
        load_profile(root)
    with pytest.raises(ProfileError, match="max_kv_tokens must be positive, got -5"):
        load_profile(root, max_kv_tokens=-5)


def test_without_throughput_the_error_says_where_the_capacity_goes(
    tmp_path: Path, write_profile: Callable[..., Path]
) -> None:
    root = write_profile(tmp_path / "p", PREFILL, "kv_usage_fraction,context_length_tokens,itl_ms\n0.5,1000,20\n", None)
    with pytest.raises(
        ProfileError, match=rf"\(in {root / 'README.md'} as 'max_kv_tokens = N', or passed explicitly\)"
    ):
        load_profile(root)
    assert load_profile(root, max_kv_tokens=8000).decode[0].decode_requests == 4.0  # 0.5 x 8000 / 1000
