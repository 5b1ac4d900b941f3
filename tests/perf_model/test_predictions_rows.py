"""``StepTimePredictions.capacity`` on a degenerate step model (docs/testing.md, mutation testing): a prefill engine
whose steps the fit prices at nothing (every non-negative coefficient 0, which the fit allows) has no engine time
to divide the utilization by, so it sustains no prefill rate: 0 req/s, never a division by zero, also when its TTFT
(all overhead) is exactly at the target. Kills predictions.py's capacity mutants 80 and 100 (each fails on its
mutant)."""

from __future__ import annotations

import pytest

from perf_model.features import StepLoad
from perf_model.predictions import StepFn, StepTimePredictions
from planner.discovery import Role


class FreeSteps(StepTimePredictions):
    """Every step costs 0 ms (a fit with every coefficient 0); TTFT is the request path's overhead alone."""

    def __init__(self, role: Role, overhead_ms: float) -> None:
        self.role = role
        self._overhead_ms = overhead_ms

    @property
    def ttft_overhead_ms(self) -> float:
        return self._overhead_ms

    def _require(self, *, prefill: bool, decode: bool) -> tuple[StepFn, float]:
        def free(load: StepLoad) -> float:
            return 0.0

        return free, 1.0


@pytest.mark.parametrize("isl_tokens", [8192.0, 1000.0])  # a whole chunk or more; a prompt sharing one
@pytest.mark.parametrize("ttft_target_ms", [5.0, 50.0])  # the TTFT (all overhead) at the target; within it
def test_free_prefill_steps_sustain_no_prefill_rate(isl_tokens: float, ttft_target_ms: float) -> None:
    cap = FreeSteps(Role.PREFILL, 5.0).capacity(
        isl_tokens=isl_tokens,
        osl_tokens=100.0,
        ttft_target_ms=ttft_target_ms,
        itl_target_ms=20.0,
        max_num_batched_tokens=8192,
    )
    assert cap.ttft_alone_ms == 5.0
    assert (cap.rps, cap.prefill_rps) == (0.0, 0.0)
