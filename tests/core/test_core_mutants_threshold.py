"""Threshold mode (planner.core.threshold) on the rows the older tests left open: data-parallel replicas for every
metric (a replica of two engines serves twice one engine's target), the smallest known capacities, a tie between
metrics (the detail names the first listed), and needs past any bound. Written for the mutants
docs/mutation-results.md listed as surviving in threshold.py."""

from __future__ import annotations

import math

import msgspec
import pytest

from planner.core import Mode, Reason, RoleLoad, ThresholdConfig
from planner.core.recommendation import MAX_SEARCH_REPLICAS
from planner.core.reconcile import Reconciled
from planner.core.threshold import recommend_threshold
from planner.discovery import Role
from tests.core.fleetkit import reconciled

CFG = ThresholdConfig()  # 2048 queued prefill tokens, 0.8 of the budget, 0.75 of KV, 0.8 of the seqs, 1 queued decode


def rec(role: Role, *, dp: int = 1, **capacity: float) -> Reconciled:
    base = reconciled(role, 4, prefill_requests=0.0, **capacity)  # type: ignore[arg-type]
    return msgspec.structs.replace(base, dp_per_replica=dp)


@pytest.mark.parametrize(
    ("case", "role", "load", "capacity", "needed", "metric"),
    [
        ("queued prefill", Role.PREFILL, RoleLoad(queued_prefill_tokens=2048.0 * 16), {}, 8, "queued prefill tokens"),
        (
            "prefill budget",
            Role.PREFILL,
            RoleLoad(scheduled_prefill_tokens=0.8 * 2048 * 16),
            {"max_num_batched_tokens": 2048},
            8,
            "prefill token budget",
        ),
        ("queued decode", Role.DECODE, RoleLoad(queued_decode_requests=16.0), {}, 8, "queued decode requests"),
        (
            "KV usage",
            Role.DECODE,
            RoleLoad(decode_kv_tokens=0.75 * 100_000 * 16),
            {"kv_capacity_tokens": 100_000},
            8,
            "KV usage",
        ),
    ],
)
def test_a_replica_of_two_engines_needs_half_the_replicas(
    case: str, role: Role, load: RoleLoad, capacity: dict[str, float], needed: int, metric: str
) -> None:
    one = recommend_threshold(role, 4, rec(role, dp=1, **capacity), load, CFG)
    two = recommend_threshold(role, 4, rec(role, dp=2, **capacity), load, CFG)
    assert (one.replicas, one.reason, one.detail) == (
        2 * needed,
        Reason.LOAD_ABOVE_TARGET,
        f"{metric} needs {2 * needed:.2f} replicas",
    ), case
    assert (two.replicas, two.reason, two.detail) == (
        needed,
        Reason.LOAD_ABOVE_TARGET,
        f"{metric} needs {needed:.2f} replicas",
    ), case


def test_a_known_capacity_of_one_token_is_a_capacity() -> None:
    budget = recommend_threshold(
        Role.PREFILL,
        1,
        rec(Role.PREFILL, max_num_batched_tokens=1),
        RoleLoad(scheduled_prefill_tokens=8.0),
        CFG,
    )
    assert (budget.replicas, budget.detail) == (10, "prefill token budget needs 10.00 replicas")
    one_token = rec(Role.DECODE, kv_capacity_tokens=1)
    kv = recommend_threshold(Role.DECODE, 1, one_token, RoleLoad(decode_kv_tokens=3.0), CFG)
    assert (kv.replicas, kv.detail) == (4, "KV usage needs 4.00 replicas")


def test_a_tie_between_metrics_names_the_first_listed() -> None:
    # 375,000 KV tokens (5 x 75,000) and 1024 decode requests (5 x 204.8): KV usage is listed first
    load = RoleLoad(decode_kv_tokens=375_000.0, decode_requests=1024.0)
    out = recommend_threshold(Role.DECODE, 2, rec(Role.DECODE, kv_capacity_tokens=100_000), load, CFG)
    assert (out.replicas, out.reason, out.mode, out.detail) == (
        5,
        Reason.LOAD_ABOVE_TARGET,
        Mode.THRESHOLD,
        "KV usage needs 5.00 replicas",
    )


def test_a_need_past_any_bound_is_recommended_as_it_is_and_an_unbounded_one_is_capped() -> None:
    huge = 3 * MAX_SEARCH_REPLICAS
    out = recommend_threshold(Role.DECODE, 4, rec(Role.DECODE), RoleLoad(queued_decode_requests=float(huge)), CFG)
    assert out.replicas == huge
    unbounded = recommend_threshold(Role.DECODE, 4, rec(Role.DECODE), RoleLoad(queued_decode_requests=math.inf), CFG)
    assert (unbounded.replicas, unbounded.reason) == (MAX_SEARCH_REPLICAS**2, Reason.LOAD_ABOVE_TARGET)
