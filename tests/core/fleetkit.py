"""Builds real FleetStore snapshots for decision-core tests: discovered workers, FPM samples ingested on their
endpoints exactly as the subscriber would, and deployment statuses. No fakes of the project's own code."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.core import (
    CoreConfig,
    CoreState,
    Decision,
    DeploymentStatus,
    ForecastConfig,
    ForecastMethod,
    Mode,
    Observation,
    PolicyKind,
    Reason,
    RoleConfig,
    RoleLoad,
    ScaleRules,
    ScalingPolicy,
    Stage,
    Traffic,
    step,
)
from planner.core.config import hpa_scale_down, hpa_scale_up
from planner.core.decision import Coverage
from planner.core.reconcile import Reconciled
from planner.discovery import EngineCapacity, Role, WorkerRecord, default_endpoints
from planner.ingest.store import FleetStore
from worker_shim.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests

# the measured H200 engine profile the core tests bootstrap their perf models from
H200_PROFILE = Path(__file__).parents[2] / ".." / "shared" / "data" / "profiles" / "h200_llama31_8b_fp8_tp1"

__all__ = ["FAST_UP", "Fleet", "Load", "Rollout", "Run", "drive_decode_rates", "hpa_config", "hpa_role", "reconciled"]

# a scale-up that lands the whole ask at once (+900 % per 15 s, no up window): the start-up and hold tests' fleets
FAST_UP = ScaleRules(
    stabilization_window_s=0.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=900.0, period_s=15.0),)
)


def hpa_role(**kw: object) -> RoleConfig:
    """A role config with Kubernetes HPA's behaviour (max(+100 %, +4) per 15 s up, 300 s window down, no forecast
    floor, no ITL margin): what the tests of the clamps and the safety rules are written against, whatever the
    shipped defaults are."""
    fields: dict[str, object] = {
        "scale_up": hpa_scale_up(),
        "scale_down": hpa_scale_down(),
        "scale_down_window_startups": None,
        "itl_headroom_frac": None,
        "forecast": ForecastConfig(method=ForecastMethod.NONE),
    }
    fields.update(kw)
    return RoleConfig(**fields)  # type: ignore[arg-type]


def hpa_config(**kw: object) -> CoreConfig:
    """:func:`hpa_role` for every role."""
    return CoreConfig(roles={role: hpa_role() for role in Role}, **kw)  # type: ignore[arg-type]


def reconciled(
    role: Role,
    engines: int,
    *,
    prefill_requests: float,
    max_num_batched_tokens: float = 2048,
    max_num_seqs: float = 256,
    kv_capacity_tokens: float = 945_029,
) -> Reconciled:
    """Reconcile's output for a fully covered service of ``engines`` single-rank engines, all ready and reporting,
    with no measured load (the tests pass theirs to the recommender); the default capacities are the H200 profile
    engine's (a 2048-token budget, 256 sequences, 945,029 KV tokens)."""
    return Reconciled(
        coverage=Coverage(
            role=role,
            service=role.value,
            discovered=engines,
            healthy=engines,
            partial=0,
            silent=0,
            identity_not_synced=0,
            not_ready=0,
            ranks_expected=engines,
            ranks_fresh=engines,
            deployment_desired=engines,
            deployment_ready=engines,
            complete=True,
        ),
        load=RoleLoad(),
        engines_expected=engines,
        engines_reporting=engines,
        engines_silent=0,
        dp_per_replica=1,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        kv_capacity_tokens=kv_capacity_tokens,
        prefill_requests=prefill_requests,
    )


CAPACITY = EngineCapacity(max_num_batched_tokens=8192, max_num_seqs=256, max_model_len=8192, kv_capacity_tokens=100_000)


class Load:
    """Per-rank load of one FPM sample."""

    def __init__(
        self, *, queued_prefill: int = 0, prefill: int = 0, decode: int = 0, kv: int = 0, queued_decode: int = 0
    ) -> None:
        self.queued_prefill = queued_prefill
        self.prefill = prefill
        self.decode = decode
        self.kv = kv
        self.queued_decode = queued_decode

    @property
    def idle(self) -> bool:
        return not (self.queued_prefill or self.prefill or self.decode or self.kv or self.queued_decode)

    def split(self, n: int) -> list[Load]:
        """This load as a total spread over ``n`` engines (remainders to the first ones)."""

        def parts(total: int) -> list[int]:
            return [total // n + (1 if i < total % n else 0) for i in range(n)]

        columns = zip(
            parts(self.queued_prefill),
            parts(self.prefill),
            parts(self.decode),
            parts(self.kv),
            parts(self.queued_decode),
            strict=True,
        )
        return [Load(queued_prefill=a, prefill=b, decode=c, kv=d, queued_decode=e) for a, b, c, d, e in columns]


IDLE = Load()


@dataclass
class Run:
    """Per tick of :meth:`Fleet.drive`: the final count, the load's count (the recommend stage), the reasons and the
    forecast stage's detail ("" without one)."""

    counts: list[int] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)
    reasons: list[tuple[Reason, ...]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


class Fleet:
    """A set of discovered workers over a real :class:`FleetStore`, and the deployments they belong to."""

    def __init__(self, *, ttl_s: float = 10.0) -> None:
        self.store = FleetStore(ttl_s=ttl_s, window_size=4)
        self.workers: dict[str, WorkerRecord] = {}
        self.counters: dict[tuple[str, int], int] = {}
        self.deployments: dict[str, DeploymentStatus] = {}
        self._host = 0

    def add(
        self,
        worker_id: str,
        role: Role,
        service: str | None = None,
        *,
        dp: int = 1,
        capacity: EngineCapacity = CAPACITY,
    ) -> WorkerRecord:
        self._host += 1
        record = WorkerRecord(
            worker_id=worker_id,
            role=role,
            service=service or role.value,
            dp_size=dp,
            fpm_endpoints=default_endpoints(f"10.0.{self._host // 250}.{self._host % 250}", dp),
            capacity=capacity,
        )
        self.workers[worker_id] = record
        self.store.set_workers(self.workers)
        return record

    def add_many(
        self, n: int, role: Role, service: str | None = None, *, dp: int = 1, prefix: str | None = None
    ) -> list[WorkerRecord]:
        start = sum(1 for w in self.workers.values() if w.role == role)
        return [self.add(f"{prefix or role.value}-{start + i}", role, service, dp=dp) for i in range(n)]

    def remove(self, worker_id: str) -> None:
        del self.workers[worker_id]
        self.store.set_workers(self.workers)

    def deploy(
        self,
        service: str,
        desired: int,
        ready: int | None = None,
        *,
        in_flight: bool = False,
        not_ready: tuple[str, ...] = (),
    ) -> None:
        self.deployments[service] = DeploymentStatus(
            service=service,
            desired=desired,
            ready=desired if ready is None else ready,
            action_in_flight=in_flight,
            not_ready_workers=not_ready,
        )

    def publish(
        self,
        worker_id: str,
        now: float,
        load: Load = IDLE,
        *,
        ranks: Iterable[int] | None = None,
        as_id: str | None = None,
    ) -> None:
        """One sample per rank (``ranks``: a subset) on the worker's own endpoints, under ``as_id`` when given
        (``""`` for an engine whose identity was never synced)."""
        record = self.workers[worker_id]
        for rank in range(record.dp_size) if ranks is None else ranks:
            key = (worker_id, rank)
            counter = self.counters.get(key, -1) + 1
            self.counters[key] = counter
            sample = ForwardPassMetrics(
                worker_id=worker_id if as_id is None else as_id,
                dp_rank=rank,
                counter_id=counter,
                wall_time=0.0 if load.idle else 0.02,
                scheduled_requests=ScheduledRequests(
                    num_prefill_requests=1 if load.prefill else 0,
                    sum_prefill_tokens=load.prefill,
                    num_decode_requests=load.decode,
                    sum_decode_kv_tokens=load.kv,
                ),
                queued_requests=QueuedRequests(
                    num_prefill_requests=1 if load.queued_prefill else 0,
                    sum_prefill_tokens=load.queued_prefill,
                    num_decode_requests=load.queued_decode,
                ),
            )
            self.store.ingest(record.fpm_endpoints[rank], sample, now, now)

    def publish_all(
        self, now: float, total: Load = IDLE, *, role: Role | None = None, skip: Iterable[str] = ()
    ) -> None:
        """``total`` spread over every (matching, not skipped) worker's ranks, one sample per rank."""
        skipped = set(skip)
        chosen = [w for w, r in self.workers.items() if w not in skipped and (role is None or r.role == role)]
        engines = [(w, rank) for w in chosen for rank in range(self.workers[w].dp_size)]
        for (wid, rank), load in zip(engines, total.split(len(engines)) if engines else [], strict=True):
            self.publish(wid, now, load, ranks=(rank,))

    def stray(self, endpoint: str, worker_id: str, now: float) -> None:
        """A sample from an id nobody registered, on an endpoint nobody registered."""
        self.store.ingest(
            endpoint, ForwardPassMetrics(worker_id=worker_id, dp_rank=0, counter_id=1, wall_time=0.02), now, now
        )

    def observe(self, now: float, traffic: Mapping[Role, Traffic] | None = None) -> Observation:
        return Observation(
            workers=dict(self.workers),
            fleet=self.store.snapshot(now),
            deployments=dict(self.deployments),
            traffic=dict(traffic or {}),
        )

    def tick(
        self,
        state: CoreState,
        now: float,
        config: CoreConfig,
        traffic: Mapping[Role, Traffic] | None = None,
        **kwargs: object,
    ) -> tuple[CoreState, dict[str, Decision]]:
        """One decision tick; the decisions by service. (Applying them is the caller's business.)"""
        state, decisions = step(state, self.observe(now, traffic), now, config, **kwargs)  # type: ignore[arg-type]
        return state, {d.service: d for d in decisions}

    def drive(
        self,
        config: CoreConfig,
        service: str,
        traffics: Sequence[Mapping[Role, Traffic]],
        load: Load,
        *,
        tick_s: float = 5.0,
        **kwargs: object,
    ) -> Run:
        """Tick every ``tick_s`` from 0 with each traffic in turn, every worker publishing ``load``, and settle
        ``service``'s decision each tick (:meth:`apply`); what each tick decided."""
        state, run = CoreState(), Run()
        for tick, traffic in enumerate(traffics):
            now = tick_s * tick
            self.publish_all(now, load)
            state, decisions = self.tick(state, now, config, traffic, **kwargs)
            decision = decisions[service]
            self.apply(decision)
            recommend = decision.stage(Stage.RECOMMEND)
            assert recommend is not None
            run.counts.append(decision.final_replicas)
            run.loads.append(recommend.replicas)
            run.reasons.append(decision.reasons)
            forecast = decision.stage(Stage.FORECAST)
            run.details.append(forecast.detail if forecast is not None else "")
        return run

    def apply(self, decision: Decision) -> None:
        """Settle a decision instantly: the deployment's desired and ready counts become the final count, and
        workers of the service are discovered (new ones) or forgotten (the newest first) to match."""
        self.deploy(decision.service, decision.final_replicas)
        mine = [w for w, r in self.workers.items() if r.service == decision.service]
        template = self.workers[mine[0]]
        for wid in mine[decision.final_replicas :][::-1]:
            self.remove(wid)
        n = len(mine)
        while n < decision.final_replicas:
            wid = f"{decision.service}-{self._next_index(decision.service)}"
            self.add(wid, template.role, decision.service, dp=template.dp_size, capacity=template.capacity)
            n += 1

    def _next_index(self, service: str) -> int:
        taken = {w for w in self.workers}
        i = 0
        while f"{service}-{i}" in taken:
            i += 1
        return i


class Rollout:
    """A deployment that takes ``ticks`` decision ticks to carry out a scale action: :meth:`settle` after each tick
    starts an action when the decision differs from the deployment's desired count (in flight meanwhile, no
    stacking) and applies it ``ticks`` ticks later."""

    def __init__(self, fleet: Fleet, service: str, ticks: int = 3) -> None:
        self.fleet, self.service, self.ticks = fleet, service, ticks
        self.pending: Decision | None = None
        self.left = 0

    def settle(self, decision: Decision) -> bool:
        """Carry ``decision`` one tick further; True on the tick an action in flight lands."""
        current = self.fleet.deployments[self.service].desired
        if self.pending is not None:
            self.left -= 1
            if self.left <= 0:
                self.fleet.apply(self.pending)
                self.pending = None
                return True
        elif decision.final_replicas != current:
            self.pending, self.left = decision, self.ticks
            self.fleet.deploy(self.service, current, in_flight=True)
        return False


def drive_decode_rates(
    rates: Sequence[float], *, rollout_ticks: int | None = None
) -> tuple[list[int], list[int], list[str]]:
    """A decode service of 3 replicas in threshold mode (20 running requests per req/s: one replica per ~10 req/s)
    with Holt's forecast floor one minute ahead and :data:`FAST_UP`, one tick per 5 s at ``rates``; each decision
    settles at once, or ``rollout_ticks`` ticks later (:class:`Rollout`). Per tick: the deployment's count after the
    tick, the load's count (the recommend stage) and the stabilize stage's detail."""
    fleet = Fleet()
    fleet.add_many(3, Role.DECODE)
    fleet.deploy("decode", 3)
    rollout = Rollout(fleet, "decode", rollout_ticks) if rollout_ticks is not None else None
    rc = hpa_role(
        mode=Mode.THRESHOLD, max_replicas=64, scale_up=FAST_UP, forecast=ForecastConfig(method=ForecastMethod.HOLT)
    )
    config = CoreConfig(roles={Role.DECODE: rc})
    state = CoreState()
    counts: list[int] = []
    loads: list[int] = []
    details: list[str] = []
    for tick, rate in enumerate(rates):
        now = 5.0 * tick
        fleet.publish_all(now, Load(decode=round(20 * rate), kv=round(200 * rate)))
        state, decisions = fleet.tick(state, now, config, {Role.DECODE: Traffic(request_rate_per_s=rate)})
        decision = decisions["decode"]
        if rollout is not None:
            rollout.settle(decision)
        else:
            fleet.apply(decision)
        recommend = decision.stage(Stage.RECOMMEND)
        stabilize = decision.stage(Stage.STABILIZE)
        assert recommend is not None and stabilize is not None
        counts.append(fleet.deployments["decode"].desired)
        loads.append(recommend.replicas)
        details.append(stabilize.detail)
    return counts, loads, details
