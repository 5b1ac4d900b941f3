"""recommend_threshold called directly (what-if tools, future callers) with a load that is not a number: it holds
the current count with load_invalid instead of reading NaN as no load and scaling to zero. (step already holds on
such a load before recommend; this is the function's own guarantee.)"""

from __future__ import annotations

import math

import msgspec
import pytest

from planner.core import Mode, Reason, ThresholdConfig
from planner.core.threshold import recommend_threshold
from planner.discovery import Role
from tests.core.fleetkit import Load
from tests.core.test_core_rows_threshold import reconciled


@pytest.mark.parametrize(
    ("role", "field", "metric"),
    [
        (Role.PREFILL, "queued_prefill_tokens", "queued prefill tokens"),
        (Role.DECODE, "decode_kv_tokens", "KV usage"),
        (Role.AGG, "queued_decode_requests", "queued decode requests"),
    ],
)
def test_a_load_that_is_not_a_number_holds_the_current_count(role: Role, field: str, metric: str) -> None:
    rec = reconciled(role, 4, Load())
    load = msgspec.structs.replace(rec.load, **{field: math.nan})
    out = recommend_threshold(role, 4, rec, load, ThresholdConfig())
    assert out.replicas == 4
    assert out.reason is Reason.LOAD_INVALID and out.mode is Mode.THRESHOLD
    assert out.detail == f"{metric} is not a number: holding 4"


def test_an_infinite_load_still_asks_for_the_most_it_can() -> None:
    rec = reconciled(Role.DECODE, 4, Load())
    load = msgspec.structs.replace(rec.load, queued_decode_requests=math.inf)
    out = recommend_threshold(Role.DECODE, 4, rec, load, ThresholdConfig())
    assert out.reason is Reason.LOAD_ABOVE_TARGET and out.replicas > 4
