"""Features of one engine step, from the FPM ``scheduled_requests`` fields.

Every column is a cost the step pays, so every coefficient is non-negative (see ``docs/perf_model.md``):

=================  ===========================================  ==========================================
column             value                                        cost it stands for
=================  ===========================================  ==========================================
``one``            1                                            step floor: launch, scheduling, sampling
``prefill``        P = ``sum_prefill_tokens``                   weights (GEMMs) for the tokens computed
``prefill_attn``   P * (Pkv + P/2)                              attention of new tokens over cached + own
``decode``         B = ``num_decode_requests``                  weights + per-sequence sampling per decode
``decode_kv``      K = ``sum_decode_kv_tokens``                 attention reads of the decode KV cache
=================  ===========================================  ==========================================

``Pkv`` is ``sum_prefill_kv_tokens`` (tokens read from cache or earlier chunks). ``P * (Pkv + P/2)`` is exact
for one request (token i of a chunk attends to ``Pkv + i`` tokens) and an upper bound when several requests
share the step (FPM reports sums only). Prefill engines use the prefill columns, decode engines the decode
columns, aggregated engines all of them.
"""

from __future__ import annotations

import math

from planner.discovery import Role
from worker_shim.fpm import ScheduledRequests

__all__ = ["COLUMNS", "StepLoad", "feature_row", "load_of"]

COLUMNS: dict[Role, tuple[str, ...]] = {
    Role.PREFILL: ("one", "prefill", "prefill_attn"),
    Role.DECODE: ("one", "decode", "decode_kv"),
    Role.AGG: ("one", "prefill", "prefill_attn", "decode", "decode_kv"),
}

StepLoad = tuple[float, float, float, float]
"""``(prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)`` of one step."""


def load_of(scheduled: ScheduledRequests) -> StepLoad:
    return (
        float(scheduled.sum_prefill_tokens),
        float(scheduled.sum_prefill_kv_tokens),
        float(scheduled.num_decode_requests),
        float(scheduled.sum_decode_kv_tokens),
    )


def feature_row(role: Role, load: StepLoad) -> list[float]:
    """The role's feature columns (in :data:`COLUMNS` order) for one step load."""
    p, pkv, b, k = load
    if role is Role.PREFILL:
        return [1.0, p, p * (pkv + p / 2.0)]
    if role is Role.DECODE:
        return [1.0, b, k]
    return [1.0, p, p * (pkv + p / 2.0), b, k]


def valid_load(load: StepLoad) -> bool:
    return all(math.isfinite(v) and v >= 0.0 for v in load)
