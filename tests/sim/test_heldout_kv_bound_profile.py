"""The held-out suite's SYNTHETIC KV-bound engine profile (docs/replay-heldout/profiles/synthetic_kv_bound_tp1):
its CSVs are what its generator writes, the perf model's step timer (which times the simulated engines and
bootstraps "ours") recovers every point, and the SLA the held-out runs score (2000 / 50 ms) is feasible on it."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from perf_model.step_timer import ProfileStepTimer

PROFILES = Path(__file__).resolve().parents[2] / "docs" / "replay-heldout" / "profiles"
PROFILE = PROFILES / "synthetic_kv_bound_tp1"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_kv_bound_profile", PROFILES / "make_kv_bound_profile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_committed_csvs_are_what_the_generator_writes(tmp_path: Path) -> None:
    _generator().main(tmp_path)
    for name in ("prefill.csv", "decode.csv"):
        assert (tmp_path / name).read_text() == (PROFILE / name).read_text(), name


def test_the_perf_model_fit_recovers_every_point_of_the_profile() -> None:
    gen = _generator()
    timer = ProfileStepTimer.from_dir(PROFILE)
    assert timer.params.max_kv_tokens == gen.MAX_KV_TOKENS  # read from the README, as for the H200 profile
    decode = _rows(PROFILE / "decode.csv")
    assert len(decode) >= 40
    for row in decode:
        itl_ms = float(row["itl_ms"])
        batch = float(row["throughput_tokens_per_s_per_gpu"]) * itl_ms / 1000.0  # Little's law gives the batch
        kv_tokens = batch * float(row["context_length_tokens"])
        assert timer.step_time_ms(0, 0, batch, kv_tokens) == pytest.approx(itl_ms, rel=1e-3), row
    prefill = _rows(PROFILE / "prefill.csv")
    assert len(prefill) >= 10
    for row in prefill:
        isl = float(row["isl_tokens"])
        predicted = timer.step_time_ms(isl, 0, 0, 0) + timer.ttft_overhead_ms
        assert predicted == pytest.approx(float(row["ttft_ms"]), rel=1e-3), row
    # the shape it is there for: KV-bound (total KV dominates the step), no launch floor, a high per-step constant
    assert timer.params.decode_ms_per_kv_token * 1000 > 5 * timer.params.decode_ms_per_request
    assert timer.params.base_ms == pytest.approx(gen.BASE_MS, rel=1e-3)


def test_the_held_out_sla_is_feasible_on_it() -> None:
    gen = _generator()
    assert gen.prefill_ttft_ms(16372) < 2000.0  # the profile's longest prompt alone meets the TTFT target
    # the ITL target is met by a batch of a hundred sequences at the held-out scenarios' median context (~1100)
    assert gen.decode_itl_ms(100, 100 * 1100) < 50.0
    # and it is KV-bound: the same batch at a 4000-token context is past it
    assert gen.decode_itl_ms(100, 100 * 4000) > 50.0
