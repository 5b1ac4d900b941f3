from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perf_model.errors import ProfileError
from perf_model.profile import load_profile
from planner.errors import ConfigError

PREFILL = "isl_tokens,ttft_ms\n100,10\n1000,30\n"
DECODE = "kv_usage_fraction,context_length_tokens,itl_ms\n0.1,100,5\n0.5,100,9\n"


def test_h200_profile_loads_with_batches_from_littles_law(h200_dir: Path) -> None:
    profile = load_profile(h200_dir)
    assert profile.max_kv_tokens == 945029
    assert len(profile.prefill) == 17
    assert len(profile.decode) == 41
    # A near-empty KV cache decodes one sequence: throughput x ITL ~ 1.
    first = profile.decode[0]
    assert first.context_length_tokens == 350
    assert first.decode_requests == pytest.approx(1.0, abs=0.02)
    assert all(d.decode_kv_tokens == pytest.approx(d.decode_requests * d.context_length_tokens) for d in profile.decode)


def test_any_directory_in_the_format_loads(tmp_path: Path, write_profile: Callable[..., Path]) -> None:
    profile = load_profile(write_profile(tmp_path / "mine", PREFILL, DECODE))
    assert profile.name == "mine"
    # Without throughput the batch is kv_usage_fraction * max_kv_tokens / context.
    assert [d.decode_requests for d in profile.decode] == [1.0, 5.0]


@pytest.mark.parametrize(
    ("name", "prefill", "decode", "readme", "message"),
    [
        (
            "missing column",
            "isl_tokens,ttft\n100,10\n",
            DECODE,
            "max_kv_tokens = 1000",
            "missing column(s) ttft_ms",
        ),
        (
            "not a number",
            "isl_tokens,ttft_ms\n100,fast\n",
            DECODE,
            "max_kv_tokens = 1000",
            "row 2: field 'ttft_ms'",
        ),
        (
            "negative time",
            "isl_tokens,ttft_ms\n100,-1\n",
            DECODE,
            "max_kv_tokens = 1000",
            "field 'ttft_ms' must be",
        ),
        ("empty file", "isl_tokens,ttft_ms\n", DECODE, "max_kv_tokens = 1000", "no data rows"),
        (
            "duplicate isl",
            "isl_tokens,ttft_ms\n100,1\n100,2\n",
            DECODE,
            "max_kv_tokens = 1000",
            "appears twice",
        ),
        (
            "kv over 1",
            PREFILL,
            "kv_usage_fraction,context_length_tokens,itl_ms\n1.5,100,5\n",
            "max_kv_tokens = 9",
            "at most 1",
        ),
        ("no capacity, no throughput", PREFILL, DECODE, None, "max_kv_tokens is needed"),
    ],
)
def test_bad_profiles_are_refused_by_name(
    tmp_path: Path,
    write_profile: Callable[..., Path],
    name: str,
    prefill: str,
    decode: str,
    readme: str | None,
    message: str,
) -> None:
    root = write_profile(tmp_path / name.replace(" ", "_"), prefill, decode, readme)
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        load_profile(root)
    assert isinstance(info.value, ConfigError)


def test_missing_directory_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope")
