"""The fleet: start-up delays, draining, GPU-time accounting, routers, disaggregation, and real FPM into a
FleetStore (the in-process sink ``ours`` runs on)."""

from __future__ import annotations

import pytest

from planner.discovery import Role
from planner.errors import ConfigError
from planner.ingest.store import FleetStore
from planner.sim.engine import EngineConfig, SimRequest
from planner.sim.fleet import FleetConfig, ReplicaState, RouterKind, SimFleet, StartupMode, StoreSink
from planner.sim.timing import ProfileFitTimer

TIMER = ProfileFitTimer(base_s=0.010, a_p=0.0001, a_attn=0.0, a_d=0.001, a_kv=0.0)
ENGINE = EngineConfig(max_num_batched_tokens=1000, prefix_cache=False)


def fleet(**kw: object) -> tuple[SimFleet, list[SimRequest]]:
    done: list[SimRequest] = []
    cfg = FleetConfig(engine=ENGINE, **kw)  # type: ignore[arg-type]
    return SimFleet(cfg, TIMER, on_finish=done.append), done


def test_new_replicas_serve_only_after_the_cold_start_delay() -> None:
    f, _ = fleet(cold_start_s=60.0)
    f.scale(Role.AGG, 2, 0.0)
    f.run_until(59.9)
    assert f.counts(Role.AGG)[ReplicaState.STARTING] == 2
    assert f.workers() == {}
    f.run_until(60.0)
    assert f.counts(Role.AGG)[ReplicaState.READY] == 2
    assert len(f.workers()) == 2


def test_restore_mode_uses_the_snapshot_restore_delay() -> None:
    f, _ = fleet(cold_start_s=60.0, restore_start_s=5.0, startup_mode=StartupMode.RESTORE)
    f.scale(Role.AGG, 1, 10.0)
    f.run_until(15.0)
    assert f.counts(Role.AGG)[ReplicaState.READY] == 1


def test_gpu_hours_count_starting_ready_and_draining_replicas() -> None:
    f, _ = fleet(cold_start_s=60.0, gpus_per_replica=2)
    f.scale(Role.AGG, 1, 0.0, instant=True)
    f.scale(Role.AGG, 3, 1800.0)  # two more from 30 min on, starting counts
    assert f.gpu_hours(3600.0) == pytest.approx(2 * (1.0 + 2 * 0.5))


def test_scale_down_drains_the_least_loaded_replica_and_removes_it_when_empty() -> None:
    f, done = fleet()
    f.scale(Role.AGG, 2, 0.0, instant=True)
    f.submit(SimRequest(0, 0.0, 500, 50), 0.0)  # lands on one replica
    busy = next(r for r in f.replicas[Role.AGG] if r.engine.num_requests)
    f.scale(Role.AGG, 1, 0.001)
    # the idle one goes at once; the busy one keeps serving
    assert [r.state for r in f.replicas[Role.AGG]] == [ReplicaState.READY]
    assert f.replicas[Role.AGG][0] is busy
    f.scale(Role.AGG, 0, 0.002)
    assert busy.state is ReplicaState.DRAINING
    assert f.submit(SimRequest(1, 0.003, 10, 1), 0.003) is False  # nothing takes new requests
    f.run_until(10.0)
    assert [r.rid for r in done] == [0]
    assert busy.state in (ReplicaState.GONE,)
    assert f.total_replicas() == 0


def test_cancelled_starting_replica_hands_its_queue_to_the_next() -> None:
    f, done = fleet(cold_start_s=30.0)
    f.scale(Role.AGG, 1, 0.0)
    f.submit(SimRequest(0, 1.0, 10, 1), 1.0)  # queued on the starting replica
    f.scale(Role.AGG, 2, 2.0)
    f.scale(Role.AGG, 1, 3.0)  # cancels the newest starting replica first
    f.run_until(100.0)
    assert [r.rid for r in done] == [0]


def test_least_tokens_router_balances_and_round_robin_alternates() -> None:
    f, _ = fleet()
    f.scale(Role.AGG, 2, 0.0, instant=True)
    f.submit(SimRequest(0, 0.0, 900, 100), 0.0)
    f.submit(SimRequest(1, 0.0, 10, 1), 0.0)
    f.submit(SimRequest(2, 0.0, 10, 1), 0.0)
    loads = sorted(r.engine.num_requests for r in f.replicas[Role.AGG])
    assert loads == [1, 2]  # the small ones avoid the replica with 1000 outstanding tokens
    g, _ = fleet(router=RouterKind.ROUND_ROBIN)
    g.scale(Role.AGG, 2, 0.0, instant=True)
    for i in range(4):
        g.submit(SimRequest(i, 0.0, 900, 100), 0.0)
    assert [r.engine.num_requests for r in g.replicas[Role.AGG]] == [2, 2]


def test_disaggregated_request_prefills_then_decodes_after_the_kv_transfer() -> None:
    f, done = fleet(disaggregated=True, kv_transfer_s=0.5)
    f.scale(Role.PREFILL, 1, 0.0, instant=True)
    f.scale(Role.DECODE, 1, 0.0, instant=True)
    f.submit(SimRequest(0, 0.0, 100, 3), 0.0)
    f.run_until(10.0)
    (req,) = done
    prefill = f.replicas[Role.PREFILL][0].engine
    decode = f.replicas[Role.DECODE][0].engine
    assert prefill.steps == 1 and decode.steps == 2  # 1 prefill step; 2 decode steps for tokens 2 and 3
    ttft = req.ttft_s
    assert ttft == pytest.approx(0.010 + 0.0001 * 100)
    assert req.finish_s is not None and ttft is not None and req.finish_s > ttft + 0.5


def test_store_sink_feeds_real_fpm_with_contiguous_counters_and_heartbeats() -> None:
    store = FleetStore(ttl_s=10.0)
    sink = StoreSink(store, heartbeat_interval_s=1.0)
    f = SimFleet(FleetConfig(engine=ENGINE), TIMER, sink=sink)
    f.on_workers_changed = lambda: store.set_workers(f.workers())
    f.scale(Role.AGG, 1, 0.0, instant=True)
    f.submit(SimRequest(0, 0.0, 100, 4), 0.0)
    f.heartbeat(5.0)
    f.heartbeat(5.5)  # under the interval: no second heartbeat
    f.submit(SimRequest(1, 6.0, 100, 1), 6.0)  # a step after the heartbeat: counters must run on without a gap
    f.run_until(7.0)
    (wid,) = f.workers()
    view = store.rank_view(wid, 0, 7.0)
    assert store.drops == dict.fromkeys(store.drops, 0)
    assert view.samples == 5  # one prefill step + 3 decode steps, then one prefill step
    assert view.heartbeats == 1
    assert view.gaps == 0 and view.restarts == 0
    assert view.fresh
    last = view.last_active
    assert last is not None and last.scheduled_requests.sum_prefill_tokens == 100
    decode_steps = [s for _, s in store.window(wid, 0) if s.scheduled_requests.num_decode_requests]
    assert [s.scheduled_requests.sum_decode_kv_tokens for s in decode_steps] == [101, 102, 103]


def test_scaling_an_unknown_role_is_refused() -> None:
    f, _ = fleet()
    with pytest.raises(ConfigError):
        f.scale(Role.DECODE, 1, 0.0)
    with pytest.raises(ConfigError):
        f.scale(Role.AGG, -1, 0.0)


def test_a_request_moved_off_a_cancelled_replica_arrives_once_in_the_fpm_traffic() -> None:
    from planner.ingest.traffic import TrafficWindows

    store = FleetStore(ttl_s=100.0)
    windows = TrafficWindows(window_s=1000.0)
    f = SimFleet(FleetConfig(engine=ENGINE, cold_start_s=30.0), TIMER, sink=StoreSink(store, traffic=windows))
    f.on_workers_changed = lambda: store.set_workers(f.workers())
    f.scale(Role.AGG, 1, 0.0)
    f.submit(SimRequest(0, 1.0, 10, 5), 1.0)  # queued on the first starting replica
    f.scale(Role.AGG, 2, 2.0)
    for rid in (1, 2):
        f.submit(SimRequest(rid, 2.5, 10 + rid, 5), 2.5)  # the router spreads them over both
    assert len(f.replicas[Role.AGG][1].engine.waiting) == 1  # one on the replica about to be cancelled
    f.scale(Role.AGG, 1, 3.0)  # cancels the newest starting replica: its queue moves to the first
    f.run_until(100.0)
    got = windows.merged("sim-agg", 100.0)
    assert got is not None
    arrivals, completions, ttft, itl = got[0]
    assert (arrivals.count, arrivals.total) == (3, 10 + 11 + 12)  # each once, by the engine that served it
    assert (completions.count, completions.total) == (3, 15)
    assert ttft.count == 3 and itl.count == 3
    assert ttft.total > 3 * 27_000  # they waited for the 30 s start-up (from t = 1 or 2.5 s)
