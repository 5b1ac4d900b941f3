from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perf_model.step_timer import ProfileStepTimer

H200_PROFILE = Path(__file__).parents[2] / ".." / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"


@pytest.fixture(scope="session")
def h200_dir() -> Path:
    return H200_PROFILE


@pytest.fixture(scope="session")
def h200_timer() -> ProfileStepTimer:
    return ProfileStepTimer.from_dir(H200_PROFILE)


def _write_profile(root: Path, prefill: str, decode: str, readme: str | None = "max_kv_tokens = 1000") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "prefill.csv").write_text(prefill)
    (root / "decode.csv").write_text(decode)
    if readme is not None:
        (root / "README.md").write_text(readme)
    return root


@pytest.fixture()
def write_profile() -> Callable[..., Path]:
    """Writes a profile directory in the shared format:
    ``write_profile(root, prefill_csv, decode_csv, readme)``."""
    return _write_profile
