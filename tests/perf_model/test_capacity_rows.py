"""``PerfModel.capacity`` row by row against its documented rules, on the H200 profile (a model ready from the
profile alone): the decode batch is the largest meeting the ITL target (found here by a plain scan, not by the
model's bisection) and the KV limit; prefill requests share a chunk's step floor when shorter than the chunk;
the M/D/1 wait fixes the utilization; an aggregated engine splits its time between the two."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from perf_model.errors import InvalidLoadError
from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role

CHUNK = 8192


@pytest.fixture(scope="module")
def models(h200_timer: ProfileStepTimer) -> dict[Role, PerfModel]:
    return {role: PerfModel(role, bootstrap=h200_timer) for role in Role}


@dataclass
class Row:
    name: str
    role: Role
    isl: float
    osl: float
    ttft_ms: float
    itl_ms: float
    max_kv_tokens: float | None = None
    max_utilization: float = 0.95


ROWS = [
    Row("decode at a tight ITL target", Role.DECODE, 3000, 300, 500, 15),
    Row("decode at a loose ITL target", Role.DECODE, 3000, 300, 500, 40),
    Row("decode bounded by the KV capacity", Role.DECODE, 3000, 300, 500, 40, max_kv_tokens=33_000),
    Row("decode with short requests", Role.DECODE, 500, 100, 500, 25),
    Row("decode at an ITL no batch meets", Role.DECODE, 3000, 300, 500, 1),
    Row("prefill of prompts shorter than the chunk share its step floor", Role.PREFILL, 2000, 100, 300, 20),
    Row("prefill of prompts longer than the chunk", Role.PREFILL, 20_000, 100, 3000, 20),
    Row("prefill with a lower utilization cap", Role.PREFILL, 2000, 100, 3000, 20, max_utilization=0.5),
    Row("prefill at a TTFT no lone request meets", Role.PREFILL, 2000, 100, 10, 20),
    Row("aggregated: both shares of one engine", Role.AGG, 2000, 200, 300, 30),
    Row("aggregated with one side impossible", Role.AGG, 2000, 200, 300, 1),
]


def largest_batch(model: PerfModel, row: Row) -> int:
    ctx = row.isl + row.osl / 2.0
    limit = 1 << 20 if row.max_kv_tokens is None else int(row.max_kv_tokens // (row.isl + row.osl))
    batch = 0
    while batch < limit and model.predict_itl_ms(batch + 1, (batch + 1) * ctx).upper_ms <= row.itl_ms:
        batch += 1
    return batch


def expected_prefill_rps(model: PerfModel, row: Row) -> float:
    alone = model.predict_ttft_ms(row.isl, 0.0, CHUNK).upper_ms
    if alone > row.ttft_ms:
        return 0.0
    if row.isl >= CHUNK:
        service_ms = alone - model.ttft_overhead_ms
    else:
        floor_ms = model.predict_step_ms(1.0, 0.0, 0.0, 0.0).upper_ms
        service_ms = model.predict_step_ms(row.isl, 0.0, 0.0, 0.0).upper_ms - floor_ms + floor_ms * row.isl / CHUNK
    wait_ms = row.ttft_ms - alone
    rho = min(row.max_utilization, 2.0 * wait_ms / (service_ms + 2.0 * wait_ms))
    # the M/D/1 mean wait at rho stays within the TTFT budget
    assert rho * service_ms / (2.0 * (1.0 - rho)) <= wait_ms * (1 + 1e-9)
    return rho / service_ms * 1000.0


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_capacity(models: dict[Role, PerfModel], row: Row) -> None:
    model = models[row.role]
    out = model.capacity(
        isl_tokens=row.isl,
        osl_tokens=row.osl,
        ttft_target_ms=row.ttft_ms,
        itl_target_ms=row.itl_ms,
        max_num_batched_tokens=CHUNK,
        max_kv_tokens=row.max_kv_tokens,
        max_utilization=row.max_utilization,
    )
    assert out.ttft_alone_ms == model.predict_ttft_ms(row.isl, 0.0, CHUNK).upper_ms
    prefill = 0.0 if row.role is Role.DECODE else expected_prefill_rps(model, row)
    batch = 0 if row.role is Role.PREFILL else largest_batch(model, row)
    decode = 0.0
    if batch:
        itl = model.predict_itl_ms(batch, batch * (row.isl + row.osl / 2.0)).upper_ms
        decode = batch / (row.osl * itl / 1000.0)
    assert out.decode_batch == batch
    assert out.prefill_rps == pytest.approx(prefill, rel=1e-12)
    assert out.decode_rps == pytest.approx(decode, rel=1e-12)
    if row.role is Role.PREFILL:
        rps = prefill
    elif row.role is Role.DECODE:
        rps = decode
    else:
        rps = 1.0 / (1.0 / prefill + 1.0 / decode) if prefill > 0 and decode > 0 else 0.0
    assert out.rps == pytest.approx(rps, rel=1e-12)


def test_the_rows_cover_both_outcomes(models: dict[Role, PerfModel]) -> None:
    """Guard for the table above: some rows have capacity, some have none, and the KV limit binds where set."""
    kv_row = next(r for r in ROWS if r.max_kv_tokens is not None)
    loose = next(r for r in ROWS if r.name == "decode at a loose ITL target")
    assert largest_batch(models[Role.DECODE], kv_row) == 10 < largest_batch(models[Role.DECODE], loose)
    assert largest_batch(models[Role.DECODE], next(r for r in ROWS if r.itl_ms == 1)) == 0
    assert expected_prefill_rps(models[Role.PREFILL], next(r for r in ROWS if r.ttft_ms == 10)) == 0.0
    assert all(expected_prefill_rps(models[Role.PREFILL], r) > 0 for r in (ROWS[5], ROWS[6], ROWS[7]))


@pytest.mark.parametrize("max_utilization", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_a_utilization_cap_outside_0_1_is_refused(models: dict[Role, PerfModel], max_utilization: float) -> None:
    with pytest.raises(InvalidLoadError, match=r"max_utilization must be in \(0, 1\)"):
        models[Role.PREFILL].capacity(
            isl_tokens=2000,
            osl_tokens=100,
            ttft_target_ms=300,
            itl_target_ms=20,
            max_num_batched_tokens=CHUNK,
            max_utilization=max_utilization,
        )


@pytest.mark.parametrize(("isl", "osl"), [(-1.0, 100.0), (2000.0, math.inf)])
def test_loads_that_are_not_finite_and_non_negative_are_refused(
    models: dict[Role, PerfModel], isl: float, osl: float
) -> None:
    with pytest.raises(InvalidLoadError, match="finite and non-negative"):
        models[Role.DECODE].capacity(
            isl_tokens=isl, osl_tokens=osl, ttft_target_ms=300, itl_target_ms=20, max_num_batched_tokens=CHUNK
        )
