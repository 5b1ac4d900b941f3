"""perf_model's PerfModel offers the optional StepPredictor extension the decision core uses for aggregated
engines, and its mixed step is the sum the profile timer computes."""

from __future__ import annotations

import pytest

from perf_model.api import PerfPredictor, StepPredictor
from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role


class _DecodeOnly:
    """A predictor without predict_step_ms (the protocol's older shape)."""

    ready = True

    def predict_ttft_ms(self, isl_tokens: float, queued_prefill_tokens: float, max_num_batched_tokens: int) -> None:
        return None

    def predict_itl_ms(self, decode_requests: float, decode_kv_tokens: float) -> None:
        return None


def test_perf_model_is_a_step_predictor(h200_timer: ProfileStepTimer) -> None:
    model = PerfModel(Role.AGG, bootstrap=h200_timer)
    assert isinstance(model, StepPredictor)
    assert not isinstance(_DecodeOnly(), StepPredictor)


@pytest.mark.parametrize(("prefill", "prefill_kv", "decode", "kv"), [(2048, 0, 16, 32000), (512, 8000, 4, 64000)])
def test_mixed_step_is_the_profile_timers(
    h200_timer: ProfileStepTimer, prefill: float, prefill_kv: float, decode: float, kv: float
) -> None:
    model: PerfPredictor = PerfModel(Role.AGG, bootstrap=h200_timer)
    assert isinstance(model, StepPredictor)
    step = model.predict_step_ms(prefill, prefill_kv, decode, kv)
    assert step.value_ms == pytest.approx(h200_timer.step_time_ms(prefill, prefill_kv, decode, kv))
    # Mixed steps cost more than either part alone.
    assert step.value_ms > model.predict_step_ms(prefill, prefill_kv, 0, 0).value_ms
    assert step.value_ms > model.predict_itl_ms(decode, kv).value_ms
