"""The backlog-aware cap of a scale-up judges the queue's drain on the replicas that hold it (planner.core.backlog):
the ready ones. A queued request stays on the engine that holds it, and a replica still starting holds none of the
queue, so counting the whole desired count as draining called a queue that grows on the ready replicas one that
drains within a start-up, and held the count (found on prompt_shift, cold: "366046 queued prefill tokens drain in 5
s on 5 replicas" at 925 s while 2 were ready and the queue grew to 1.37M tokens by 970 s).

Prefill rows use the analytic predictor of tests/core/analytic_perf.py (a prefill of T tokens: ``ceil(T / chunk)
x 10 + 0.02 T`` ms, upper band x1.1) with the H200 engine's 2048-token chunk: one engine prefills 2048 / 0.05096 =
40,188 tokens/s."""

from __future__ import annotations

from planner.core import (
    CoreConfig,
    CoreState,
    Mode,
    Reason,
    RoleConfig,
    RoleLoad,
    SlaTargets,
    Stage,
    Traffic,
)
from planner.core.backlog import backlog_cap
from planner.core.recommend import recommend_sla
from planner.core.recommendation import Recommendation
from planner.discovery import EngineCapacity, Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, reconciled
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests

SLA = SlaTargets(ttft_ms=500.0, itl_ms=50.0)
QUEUED = 1_000_000.0


def six_desired(ready: int | None, rate_per_s: float) -> Recommendation:
    """6 prefill replicas desired, ``ready`` of them up (None: all), 1M prompt tokens queued, 2000-token prompts
    arriving at ``rate_per_s``, a 60 s start-up."""
    return recommend_sla(
        Role.PREFILL,
        6,
        reconciled(Role.PREFILL, 6, prefill_requests=QUEUED / 2000.0),
        RoleLoad(queued_prefill_tokens=QUEUED),
        Traffic(request_rate_per_s=rate_per_s, isl_tokens=2000.0, osl_tokens=100.0),
        AnalyticPerf(),
        SLA,
        0.0,
        64,
        startup_s=60.0,
        ready=ready,
    )


def test_a_queue_growing_on_the_ready_replicas_buys_for_the_arrivals() -> None:
    # 160,000 prompt tokens/s arrive. 2 ready replicas prefill 80,376: the queue grows on them past a start-up. The
    # 6 desired would drain it in 1e6 / (241,128 - 160,000) = 12 s, which the old cap counted: it held 6
    # (backlog_drains_before_startup). The arrivals alone need 5 replicas, so 2 holding the queue + 5 = 7: the
    # search's 7 (the backlog left after a start-up is gone there) stands.
    out = six_desired(2, 80.0)
    assert out.arrivals_replicas == 5
    assert (out.replicas, out.reason) == (7, Reason.SLA_NEEDS_MORE)
    # every replica up: the 6 drain it within a start-up, and the count holds as before
    up = six_desired(None, 80.0)
    assert (up.replicas, up.reason) == (6, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert (
        up.detail
        == "1000000 queued prefill tokens drain in 12 s on 6 replicas, before a start-up (60 s): 6 for the arrivals"
    )
    assert six_desired(6, 80.0) == up


def test_a_queue_the_ready_replicas_drain_before_a_start_up_buys_nothing() -> None:
    # 40,000 tokens/s arrive; the 2 ready replicas' surplus of 40,376 drains the 1M queue in 25 s, before the 60 s
    # start-up: replicas bought now would serve after it is gone. The 6 desired are held.
    out = six_desired(2, 20.0)
    assert (out.replicas, out.reason) == (6, Reason.BACKLOG_DRAINS_BEFORE_STARTUP)
    assert out.detail == (
        "1000000 queued prefill tokens drain in 25 s on the 2 ready of 6 replicas, before a start-up (60 s):"
        " 6 for the arrivals"
    )


def test_the_replicas_starting_count_among_those_the_arrivals_need() -> None:
    # 4 ready of 6, the queue outlasting a start-up on them (1,000 tokens/s of surplus): the arrivals need 3, and
    # the 2 starting are among those: 4 + 3 = 7, not the old 6 + 3 = 9 ...
    common = {"queued_tokens": QUEUED, "arrival_tokens_per_s": 150_000.0, "startup_s": 60.0, "arrivals_need": 3}
    assert backlog_cap(12, 6, capacity_tokens_per_s=226_500.0, ready=4, **common) == (  # type: ignore[arg-type]
        7,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "1000000 queued prefill tokens drain in 1000 s on the 4 ready of 6 replicas, past a start-up (60 s); queued"
        " requests stay there: 4 + 3 for the arrivals",
    )
    # ... and with 1 ready of 6 the 5 starting already serve the arrivals: a hold at the desired count
    assert backlog_cap(12, 6, capacity_tokens_per_s=226_500.0, ready=1, **common) == (  # type: ignore[arg-type]
        6,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "1000000 queued prefill tokens grow on the 1 ready of 6 replicas, past a start-up (60 s); queued requests"
        " stay there: 1 + 3 for the arrivals, 6 desired",
    )
    # none ready (a queue reported before readiness): nothing drains it, even where one replica would (37,750
    # tokens/s against 1,000 arriving: 27 s)
    few = {**common, "arrival_tokens_per_s": 1000.0}
    assert backlog_cap(12, 6, capacity_tokens_per_s=226_500.0, ready=0, **few) == (  # type: ignore[arg-type]
        6,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "1000000 queued prefill tokens grow on the 0 ready of 6 replicas, past a start-up (60 s); queued requests"
        " stay there: 0 + 3 for the arrivals, 6 desired",
    )
    assert backlog_cap(12, 6, capacity_tokens_per_s=226_500.0, ready=1, **few) == (  # type: ignore[arg-type]
        6,
        Reason.BACKLOG_DRAINS_BEFORE_STARTUP,
        "1000000 queued prefill tokens drain in 27 s on the 1 ready of 6 replicas, before a start-up (60 s):"
        " 6 for the arrivals",
    )
    # more ready than desired (a scale-down in flight): the desired count drains it, as before
    assert backlog_cap(12, 6, capacity_tokens_per_s=226_500.0, ready=8, **common) == backlog_cap(
        12,
        6,
        capacity_tokens_per_s=226_500.0,
        **common,  # type: ignore[arg-type]
    )


def test_the_step_counts_the_deployments_ready_replicas_as_draining() -> None:
    # The same queue through a whole tick: 6 prefill workers discovered, the deployment 2 ready of 6 (a scale-up in
    # flight), the 2 ready ones holding the queue. The recommend stage asks 7 (the old code: 6, "drain in 12 s on
    # 6 replicas"); the action in flight still holds the target until it settles.
    fleet = Fleet()
    h200 = EngineCapacity(
        max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=131_072, kv_capacity_tokens=945_029
    )
    for i in range(6):
        fleet.add(f"prefill-{i}", Role.PREFILL, capacity=h200)
    fleet.deploy("prefill", 6, ready=2)
    config = CoreConfig(
        roles={Role.PREFILL: RoleConfig(mode=Mode.SLA, sla=SLA, max_replicas=16, headroom_frac=0.0, startup_s=60.0)}
    )
    for worker in ("prefill-0", "prefill-1"):  # 250 queued 2000-token prompts each
        queue = QueuedRequests(num_prefill_requests=250, sum_prefill_tokens=int(QUEUED / 2))
        sample = ForwardPassMetrics(worker_id=worker, dp_rank=0, counter_id=0, wall_time=0.02, queued_requests=queue)
        fleet.store.ingest(fleet.workers[worker].fpm_endpoints[0], sample, 0.0, 0.0)
    traffic = {Role.PREFILL: Traffic(request_rate_per_s=80.0, isl_tokens=2000.0, osl_tokens=100.0)}
    _, decisions = fleet.tick(CoreState(), 0.0, config, traffic, predictors={Role.PREFILL: AnalyticPerf()})
    decision = decisions["prefill"]
    recommend = decision.stage(Stage.RECOMMEND)
    assert recommend is not None
    assert (recommend.replicas, recommend.reason) == (7, Reason.SLA_NEEDS_MORE)
    assert decision.final_replicas == 6
    assert Reason.ACTION_IN_FLIGHT in decision.reasons
