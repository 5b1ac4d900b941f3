"""Threshold mode (what runs whenever the perf model is not ready), row by row on ``recommend_threshold``: each
metric alone, several at once, the tolerance band's inside, outside and edge, roles that ignore a metric,
data-parallel engines per replica, unknown capacities. Loads go through a real FleetStore and reconcile.

Per-engine targets with the defaults and fleetkit's engines (8192 batched tokens, 256 seqs, 100k KV tokens):
queued prefill 2048 tokens, prefill 0.8 x 8192 = 6553.6 tokens, KV 75 000 tokens, decode batch 204.8 requests,
queued decode 1 request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from planner.core import Mode, Reason, ThresholdConfig
from planner.core.recommend import recommend_threshold
from planner.core.reconcile import Reconciled, reconcile
from planner.discovery import EngineCapacity, Role
from tests.core.fleetkit import CAPACITY, Fleet, Load

NOW = 100.0
KV = 75_000  # KV tokens one engine holds at the 0.75 target


def reconciled(
    role: Role, workers: int, total: Load, *, dp: int = 1, capacity: EngineCapacity = CAPACITY
) -> Reconciled:
    fleet = Fleet()
    for i in range(workers):
        fleet.add(f"{role.value}-{i}", role, dp=dp, capacity=capacity)
    fleet.deploy(role.value, workers)
    fleet.publish_all(NOW, total)
    return reconcile(
        role, role.value, list(fleet.workers.values()), fleet.store.snapshot(NOW), fleet.deployments[role.value]
    )


@dataclass
class Row:
    name: str
    role: Role
    load: Load
    expected: int
    reason: Reason
    detail: str
    current: int = 4
    workers: int = 4
    dp: int = 1
    capacity: EngineCapacity = CAPACITY
    cfg: ThresholdConfig = field(default_factory=ThresholdConfig)


ROWS = [
    Row(
        "KV usage alone: six engines' worth of KV on four asks for 6",
        Role.DECODE,
        Load(kv=6 * KV),
        6,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 6.00 replicas",
    ),
    Row(
        "KV usage 5 % over the target stays within the 10 % tolerance",
        Role.DECODE,
        Load(kv=int(4.2 * KV)),
        4,
        Reason.WITHIN_TOLERANCE,
        "KV usage needs 4.20 replicas, within 10% of 4",
    ),
    Row(
        "KV usage 15 % over the target is outside the tolerance: ceil(4.6) = 5",
        Role.DECODE,
        Load(kv=int(4.6 * KV)),
        5,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 4.60 replicas",
    ),
    Row(
        "KV usage 7.5 % under the target stays within the tolerance",
        Role.DECODE,
        Load(kv=int(3.7 * KV)),
        4,
        Reason.WITHIN_TOLERANCE,
        "KV usage needs 3.70 replicas, within 10% of 4",
    ),
    Row(
        "KV usage 25 % under the target scales down to 3",
        Role.DECODE,
        Load(kv=3 * KV),
        3,
        Reason.LOAD_BELOW_TARGET,
        "KV usage needs 3.00 replicas",
    ),
    Row(
        "a ratio exactly on the tolerance edge (5 / 4 = 1 + 0.25) is within it",
        Role.DECODE,
        Load(kv=5 * KV),
        4,
        Reason.WITHIN_TOLERANCE,
        "KV usage needs 5.00 replicas, within 25% of 4",
        cfg=ThresholdConfig(tolerance_frac=0.25),
    ),
    Row(
        "with no tolerance a need that rounds up to the current count is a hold, not a scale-down",
        Role.DECODE,
        Load(kv=int(3.5 * KV)),
        4,
        Reason.WITHIN_TOLERANCE,
        "KV usage needs 3.50 replicas",
        cfg=ThresholdConfig(tolerance_frac=0.0),
    ),
    Row(
        "several metrics: KV (6) beats the decode batch (5)",
        Role.DECODE,
        Load(kv=6 * KV, decode=1024),
        6,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 6.00 replicas",
    ),
    Row(
        "several metrics: the decode batch (10) beats KV (6)",
        Role.DECODE,
        Load(kv=6 * KV, decode=2048),
        10,
        Reason.LOAD_ABOVE_TARGET,
        "decode batch needs 10.00 replicas",
    ),
    Row(
        "queued decode requests alone: 12 waiting at a target of 1 per engine",
        Role.DECODE,
        Load(queued_decode=12),
        12,
        Reason.LOAD_ABOVE_TARGET,
        "queued decode requests needs 12.00 replicas",
    ),
    Row(
        "a decode role ignores prefill load",
        Role.DECODE,
        Load(queued_prefill=100_000, prefill=30_000),
        0,
        Reason.NO_LOAD,
        "no load on any reporting engine",
    ),
    Row(
        "a prefill role ignores decode load",
        Role.PREFILL,
        Load(kv=6 * KV, decode=2048, queued_decode=12),
        0,
        Reason.NO_LOAD,
        "no load on any reporting engine",
    ),
    Row(
        "queued prefill tokens alone: 6 x 2048 asks for 6",
        Role.PREFILL,
        Load(queued_prefill=6 * 2048),
        6,
        Reason.LOAD_ABOVE_TARGET,
        "queued prefill tokens needs 6.00 replicas",
    ),
    Row(
        "the prefill token budget alone: 5 x 6553.6 tokens per step asks for 5",
        Role.PREFILL,
        Load(prefill=32_768),
        5,
        Reason.LOAD_ABOVE_TARGET,
        "prefill token budget needs 5.00 replicas",
    ),
    Row(
        "an aggregated role takes the largest of prefill and decode metrics",
        Role.AGG,
        Load(kv=6 * KV, queued_prefill=8 * 2048),
        8,
        Reason.LOAD_ABOVE_TARGET,
        "queued prefill tokens needs 8.00 replicas",
    ),
    Row(
        "an aggregated role reads decode metrics too",
        Role.AGG,
        Load(kv=6 * KV, queued_prefill=2048),
        6,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 6.00 replicas",
    ),
    Row(
        "two engines per replica halve the replicas needed",
        Role.DECODE,
        Load(kv=6 * KV),
        3,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 3.00 replicas",
        current=2,
        workers=2,
        dp=2,
    ),
    Row(
        "from zero replicas any load is a scale-up (no tolerance test against 0)",
        Role.DECODE,
        Load(kv=KV // 2),
        1,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 0.50 replicas",
        current=0,
    ),
    Row(
        "an unknown KV capacity skips the KV metric",
        Role.DECODE,
        Load(kv=6 * KV),
        0,
        Reason.NO_LOAD,
        "no load on any reporting engine",
        capacity=EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, kv_capacity_tokens=0),
    ),
    Row(
        "an unknown max_num_seqs skips the decode-batch metric",
        Role.DECODE,
        Load(decode=2048),
        0,
        Reason.NO_LOAD,
        "no load on any reporting engine",
        capacity=EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=0, kv_capacity_tokens=100_000),
    ),
    Row(
        "an unknown token budget skips the prefill-budget metric",
        Role.PREFILL,
        Load(prefill=32_768),
        0,
        Reason.NO_LOAD,
        "no load on any reporting engine",
        capacity=EngineCapacity(max_num_batched_tokens=0, max_num_seqs=256, kv_capacity_tokens=100_000),
    ),
    Row(
        "one sequence per engine: 4 running decodes at 0.8 x 1 per engine ask for 5",
        Role.DECODE,
        Load(decode=4),
        5,
        Reason.LOAD_ABOVE_TARGET,
        "decode batch needs 5.00 replicas",
        capacity=EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=1, kv_capacity_tokens=0),
    ),
    Row(
        "a single replica within the tolerance holds (5 % over)",
        Role.DECODE,
        Load(kv=int(1.05 * KV)),
        1,
        Reason.WITHIN_TOLERANCE,
        "KV usage needs 1.05 replicas, within 10% of 1",
        current=1,
        workers=1,
    ),
    Row(
        "a stricter KV target asks for more: 6 engines' worth at 0.75 is 9 at 0.5",
        Role.DECODE,
        Load(kv=6 * KV),
        9,
        Reason.LOAD_ABOVE_TARGET,
        "KV usage needs 9.00 replicas",
        cfg=ThresholdConfig(kv_usage_frac=0.5),
    ),
    Row(
        "a looser queued-decode target asks for fewer: 12 waiting at 4 per engine is 3",
        Role.DECODE,
        Load(queued_decode=12),
        3,
        Reason.LOAD_BELOW_TARGET,
        "queued decode requests needs 3.00 replicas",
        cfg=ThresholdConfig(queued_decode_requests_per_engine=4.0),
    ),
    Row(
        "a looser decode-batch target asks for fewer: 2048 at 0.4 x 256 per engine is 20",
        Role.DECODE,
        Load(decode=2048),
        20,
        Reason.LOAD_ABOVE_TARGET,
        "decode batch needs 20.00 replicas",
        cfg=ThresholdConfig(decode_seq_frac=0.4),
    ),
    Row(
        "a looser queued-prefill target asks for fewer: 6 x 2048 at 4096 per engine is 3",
        Role.PREFILL,
        Load(queued_prefill=6 * 2048),
        3,
        Reason.LOAD_BELOW_TARGET,
        "queued prefill tokens needs 3.00 replicas",
        cfg=ThresholdConfig(queued_prefill_tokens_per_engine=4096.0),
    ),
    Row(
        "a looser prefill budget asks for fewer: 32768 tokens at 0.4 x 8192 is 10",
        Role.PREFILL,
        Load(prefill=32_768),
        10,
        Reason.LOAD_ABOVE_TARGET,
        "prefill token budget needs 10.00 replicas",
        cfg=ThresholdConfig(prefill_budget_frac=0.4),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_recommend_threshold(row: Row) -> None:
    rec = reconciled(row.role, row.workers, row.load, dp=row.dp, capacity=row.capacity)
    out = recommend_threshold(row.role, row.current, rec, rec.load, row.cfg)
    assert (out.replicas, out.reason, out.mode) == (row.expected, row.reason, Mode.THRESHOLD)
    assert out.detail == row.detail


def test_silent_engines_count_as_idle_capacity() -> None:
    """Two of four engines report six engines' worth of KV between them: the need is over the total, so the
    silent two count as idle capacity (6, not 2 x 6 / 2 x 2)."""
    fleet = Fleet()
    for i in range(4):
        fleet.add(f"decode-{i}", Role.DECODE)
    fleet.deploy("decode", 4)
    fleet.publish_all(NOW, Load(kv=6 * KV), skip=("decode-2", "decode-3"))
    rec = reconcile(
        Role.DECODE, "decode", list(fleet.workers.values()), fleet.store.snapshot(NOW), fleet.deployments["decode"]
    )
    out = recommend_threshold(Role.DECODE, 4, rec, rec.load, ThresholdConfig())
    assert (out.replicas, out.reason) == (6, Reason.LOAD_ABOVE_TARGET)
