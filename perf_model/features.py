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

Engines of other shapes (a launch-bound floor: flat until the batch fills the GPU, then rising; attention that
turns expensive past a KV size) get **hinge** columns ``max(0, x - knot)`` on ``P``, ``B`` or ``K``, chosen by the
fit (:func:`perf_model.model.fit_step_time`): a non-negative coefficient on a hinge keeps the model monotone, and
with the linear term at 0 it is a floor followed by a slope.

``Pkv`` is ``sum_prefill_kv_tokens`` (tokens read from cache or earlier chunks). ``P * (Pkv + P/2)`` is exact
for one request (token i of a chunk attends to ``Pkv + i`` tokens) and an upper bound when several requests
share the step (FPM reports sums only). Prefill engines use the prefill columns, decode engines the decode
columns, aggregated engines all of them.
"""

from __future__ import annotations

import math

from planner.discovery import Role
from worker_shim.fpm import ScheduledRequests

__all__ = ["COLUMNS", "HINGE_VARIABLES", "Hinge", "StepLoad", "feature_row", "hinge_name", "load_of"]

COLUMNS: dict[Role, tuple[str, ...]] = {
    Role.PREFILL: ("one", "prefill", "prefill_attn"),
    Role.DECODE: ("one", "decode", "decode_kv"),
    Role.AGG: ("one", "prefill", "prefill_attn", "decode", "decode_kv"),
}

StepLoad = tuple[float, float, float, float]
"""``(prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)`` of one step."""

Hinge = tuple[int, float]
"""``(index into StepLoad, knot)``: the column ``max(0, load[index] - knot)``."""

# The load variables a role's hinges may bend on: prefill tokens, decode requests, decode KV tokens.
HINGE_VARIABLES: dict[Role, tuple[int, ...]] = {
    Role.PREFILL: (0,),
    Role.DECODE: (2, 3),
    Role.AGG: (0, 2, 3),
}
_HINGE_NAMES = ("prefill", "prefill_kv", "decode", "decode_kv")


def hinge_name(hinge: Hinge) -> str:
    return f"{_HINGE_NAMES[hinge[0]]}>{hinge[1]:g}"


def load_of(scheduled: ScheduledRequests) -> StepLoad:
    return (
        float(scheduled.sum_prefill_tokens),
        float(scheduled.sum_prefill_kv_tokens),
        float(scheduled.num_decode_requests),
        float(scheduled.sum_decode_kv_tokens),
    )


def feature_row(role: Role, load: StepLoad, hinges: tuple[Hinge, ...] = ()) -> list[float]:
    """The role's feature columns (in :data:`COLUMNS` order, then one per hinge) for one step load."""
    p, pkv, b, k = load
    if role is Role.PREFILL:
        row = [1.0, p, p * (pkv + p / 2.0)]
    elif role is Role.DECODE:
        row = [1.0, b, k]
    else:
        row = [1.0, p, p * (pkv + p / 2.0), b, k]
    row.extend(max(0.0, load[i] - knot) for i, knot in hinges)
    return row


def valid_load(load: StepLoad) -> bool:
    return all(math.isfinite(v) and v >= 0.0 for v in load)
