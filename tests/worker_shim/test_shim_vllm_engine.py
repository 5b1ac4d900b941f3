"""The shim inside real vLLM CPU engines (tiny random-weight Llama, no download), DP=1 and DP=2.

Four engines, each shared by the tests of one fixture: cold-started with an id (DP 1: the suite's shared engine,
``tests/conftest.py``; DP 2) and started without one, as a snapshot-restored engine is (DP 1, 2). The restored
engines reproduce the bug first (samples under ``""``), then show that a rank that does not answer fails the sync
within its timeout, then that after :func:`worker_shim.sync_worker_id` every rank's step samples and heartbeats
carry the id, end to end through the planner's FpmSubscriber and FleetStore.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from planner.discovery import Role, WorkerRecord
from planner.ingest.store import DropReason, FleetStore
from planner.ingest.subscriber import FpmSubscriber
from tests.fakes.tiny_vllm import FpmCollector, TinyEngine, write_tiny_llama
from worker_shim import sync_worker_id
from worker_shim.fpm import ForwardPassMetrics
from worker_shim.identity import STATS_METHOD, WorkerIdSyncError

pytestmark = pytest.mark.vllm

PROMPT_LENGTHS = (40, 24, 33, 57, 18, 29, 45, 21)
MAX_TOKENS = 6
RESTORED_ID = "w-restored"


def _prompts(lengths: tuple[int, ...] = PROMPT_LENGTHS) -> list[list[int]]:
    return [[(7 * i + j) % 1000 + 3 for j in range(n)] for i, n in enumerate(lengths)]


def _active(samples: list[ForwardPassMetrics]) -> list[ForwardPassMetrics]:
    return [s for s in samples if not s.is_heartbeat]


def _every_endpoint_heard(collector: FpmCollector) -> bool:
    return all(collector.samples(e) for e in collector.endpoints)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def cold(request: pytest.FixtureRequest, tiny_model: Path) -> Iterator[tuple[TinyEngine, FpmCollector]]:
    dp: int = request.param
    if dp == 1:  # the suite's shared engine: DP=1, cold-started with an id; idle before these tests start
        engine, collector = request.getfixturevalue("shared_engine_session")
        assert collector.wait_for(
            lambda c: all(c.samples(e)[-1:] and c.samples(e)[-1].is_heartbeat for e in c.endpoints)
        )
        yield engine, collector
        return
    with (
        TinyEngine(tiny_model, dp_size=dp, worker_id=f"w-cold-{dp}") as engine,
        FpmCollector(engine.endpoints) as collector,
    ):
        assert collector.wait_for(_every_endpoint_heard, timeout_s=30), "no heartbeat from some rank"
        yield engine, collector


class Restored:
    """A shim engine started without an id, with the planner's ingest (subscriber + store) watching it."""

    def __init__(self, engine: TinyEngine, collector: FpmCollector, subscriber: FpmSubscriber) -> None:
        self.engine = engine
        self.collector = collector
        self.subscriber = subscriber

    def snapshot_now(self) -> Any:
        return self.subscriber.snapshot(time.monotonic())


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def restored(request: pytest.FixtureRequest, tiny_model: Path) -> Iterator[Restored]:
    dp: int = request.param
    with TinyEngine(tiny_model, dp_size=dp, worker_id=None) as engine, FpmCollector(engine.endpoints) as collector:
        record = WorkerRecord(
            worker_id=RESTORED_ID, role=Role.AGG, service="tiny", dp_size=dp, fpm_endpoints=engine.endpoints
        )
        subscriber = FpmSubscriber(FleetStore(ttl_s=30.0))
        subscriber.set_workers({RESTORED_ID: record})
        with subscriber:
            assert collector.wait_for(_every_endpoint_heard, timeout_s=30), "no heartbeat from some rank"
            yield Restored(engine, collector, subscriber)


# -- cold start ------------------------------------------------------------------------------------------------


def test_cold_start_samples_carry_the_id_and_count_every_token(cold: tuple[TinyEngine, FpmCollector]) -> None:
    engine, collector = cold
    collector.clear()
    outputs = engine.generate(_prompts(), MAX_TOKENS)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [MAX_TOKENS] * len(PROMPT_LENGTHS)
    total_prompt = sum(PROMPT_LENGTHS)
    decodes = len(PROMPT_LENGTHS) * (MAX_TOKENS - 1)  # the first token of each comes from its prefill step

    def complete(c: FpmCollector) -> bool:
        active = _active(c.samples())
        return (
            sum(s.scheduled_requests.num_decode_requests for s in active) >= decodes
            and sum(s.scheduled_requests.sum_prefill_tokens for s in active) >= total_prompt
        )

    collector.wait_for(complete, timeout_s=30)
    active = _active(collector.samples())
    assert sum(s.scheduled_requests.sum_prefill_tokens for s in active) == total_prompt
    assert sum(s.scheduled_requests.num_prefill_requests for s in active) == len(PROMPT_LENGTHS)
    assert sum(s.scheduled_requests.sum_prefill_kv_tokens for s in active) == 0  # prefix caching off, no chunks
    assert sum(s.scheduled_requests.num_decode_requests for s in active) == decodes
    assert active and all(s.wall_time > 0 for s in active)
    for rank, endpoint in enumerate(engine.endpoints):
        samples = collector.samples(endpoint)
        assert {s.worker_id for s in samples} == {engine.worker_id}, f"rank {rank}"
        assert {s.dp_rank for s in samples} == {rank}
        assert _active(samples), f"rank {rank} ran no step"  # the load balancer spread the requests
    # Idle again: every rank falls back to heartbeats, still under the id.
    assert collector.wait_for(lambda c: all(c.samples(e)[-1].is_heartbeat for e in c.endpoints))
    assert {s.worker_id for s in collector.samples()} == {engine.worker_id}


def test_decode_kv_tokens_are_the_context_of_each_decode(cold: tuple[TinyEngine, FpmCollector]) -> None:
    engine, collector = cold
    collector.clear()
    engine.generate(_prompts((30,)), 4)
    assert collector.wait_for(
        lambda c: sum(s.scheduled_requests.num_decode_requests for s in _active(c.samples())) >= 3
    )
    decode_kv = [
        s.scheduled_requests.sum_decode_kv_tokens
        for s in _active(collector.samples())
        if s.scheduled_requests.num_decode_requests
    ]
    assert decode_kv == [30, 31, 32]


def test_publisher_dropped_nothing(cold: tuple[TinyEngine, FpmCollector]) -> None:
    engine, _ = cold
    stats = engine.run(engine.engine_core.call_utility_all_async(STATS_METHOD))
    assert stats and sorted(s["dp_rank"] for s in stats) == list(range(engine.dp_size))
    assert all(s["dropped_queue_full"] == 0 and s["dropped_send"] == 0 for s in stats), stats
    assert all(s["step_read_errors"] == 0 for s in stats), stats
    assert all(s["worker_id"] == engine.worker_id for s in stats)


# -- restore ---------------------------------------------------------------------------------------------------


def test_unsynced_engine_publishes_under_the_empty_id(restored: Restored) -> None:
    """The bug this project exists to end, reproduced: the planner drops everything this worker sends."""
    restored.collector.clear()
    restored.engine.generate(_prompts(), MAX_TOKENS)
    assert restored.collector.wait_for(lambda c: all(_active(c.samples(e)) for e in c.endpoints))
    assert {s.worker_id for s in restored.collector.samples()} == {""}
    snap = restored.snapshot_now()
    assert snap.drops[DropReason.EMPTY_WORKER_ID] > 0
    assert snap.drops_by_worker[RESTORED_ID][DropReason.EMPTY_WORKER_ID] > 0
    assert snap.ranks and all(view.samples == 0 and view.heartbeats == 0 for view in snap.ranks.values())
    assert snap.endpoints and all(seen.worker_id == "" for seen in snap.endpoints.values())


def test_a_rank_that_does_not_answer_fails_the_sync_within_its_timeout(restored: Restored) -> None:
    engine = restored.engine
    stats = engine.run(engine.engine_core.call_utility_all_async(STATS_METHOD))
    silent_rank = engine.dp_size - 1
    pid = next(s["pid"] for s in stats if s["dp_rank"] == silent_rank)
    os.kill(pid, signal.SIGSTOP)  # our own engine process; resumed below
    try:
        with pytest.raises(WorkerIdSyncError) as info:
            engine.run(asyncio.wait_for(sync_worker_id(engine.engine_core, "w-timeout", timeout_s=2.0), 60))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert info.value.failed_ranks == (silent_rank,)
    assert "no answer within 2s" in str(info.value)
    assert f"rank {silent_rank}" in str(info.value)


def test_after_sync_every_rank_publishes_the_registered_id(restored: Restored) -> None:
    engine, collector = restored.engine, restored.collector
    ranks = engine.run(sync_worker_id(engine.engine_core, RESTORED_ID, timeout_s=30.0))
    assert ranks == tuple(range(engine.dp_size))
    collector.clear()
    # Heartbeats first (the engine is idle), then step samples.
    assert collector.wait_for(lambda c: all(any(s.is_heartbeat for s in c.samples(e)) for e in c.endpoints))
    engine.generate(_prompts(), MAX_TOKENS)
    assert collector.wait_for(lambda c: all(_active(c.samples(e)) for e in c.endpoints))
    collector.wait_for(lambda c: all(c.samples(e)[-1].is_heartbeat for e in c.endpoints))
    for rank, endpoint in enumerate(engine.endpoints):
        samples = collector.samples(endpoint)
        assert {s.worker_id for s in samples} == {RESTORED_ID}, f"rank {rank}"
        assert any(s.is_heartbeat for s in samples) and _active(samples), f"rank {rank}"


def test_planner_store_holds_every_rank_only_after_the_sync(restored: Restored) -> None:
    """The store that held nothing of this worker before the sync (test above) holds every rank after it."""
    dp = restored.engine.dp_size
    restored.engine.run(sync_worker_id(restored.engine.engine_core, RESTORED_ID, timeout_s=30.0))  # idempotent
    restored.engine.generate(_prompts(), MAX_TOKENS)

    def all_ranks_active() -> bool:
        snap = restored.snapshot_now()
        return all(v.fresh and v.samples > 0 and v.heartbeats > 0 for v in snap.ranks.values())

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all_ranks_active():
        time.sleep(0.1)
    snap = restored.snapshot_now()
    assert sorted(snap.ranks) == [(RESTORED_ID, r) for r in range(dp)]
    for (wid, rank), view in snap.ranks.items():
        assert view.fresh and view.samples > 0 and view.heartbeats > 0, (wid, rank, view)
        assert view.latest is not None and view.latest.worker_id == RESTORED_ID and view.latest.dp_rank == rank
    assert snap.endpoints and all(seen.worker_id == RESTORED_ID for seen in snap.endpoints.values())


def test_fallback_through_call_utility_all_async_reaches_every_rank(restored: Restored) -> None:
    """A client that only has vLLM's public fan-out (no per-engine call) is synced through it."""
    engine = restored.engine

    class PublicFanOutOnly:
        def __init__(self, client: Any) -> None:
            self.core_engines = client.core_engines
            self.call_utility_all_async = client.call_utility_all_async

    ranks = engine.run(sync_worker_id(PublicFanOutOnly(engine.engine_core), RESTORED_ID, timeout_s=30.0))
    assert ranks == tuple(range(engine.dp_size))
