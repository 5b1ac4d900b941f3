"""A simulated fleet: replicas of :class:`~planner.sim.engine.SimEngine` per role, a router, scale actions that
take effect after a start-up delay, draining on removal, and GPU-time accounting. Event-driven: engine steps,
replica start-ups and KV transfers sit in one time-ordered heap; :meth:`SimFleet.run_until` advances it.

Roles: one ``agg`` role (aggregated engines), or ``prefill`` + ``decode`` (disaggregated: a request is
prefilled on a prefill engine, its KV travels for ``kv_transfer_s``, then it decodes on a decode engine; TTFT is
taken on the prefill engine).

Samples go to a :class:`FpmSink` (:mod:`planner.sim.sinks`): :class:`StoreSink` feeds a
:class:`~planner.ingest.store.FleetStore` in-process (replay), :class:`ZmqSink` publishes over real ZMQ through
:class:`~worker_shim.publisher.FpmPublisher` (demo). The fleet never reads a clock: every call takes ``now``.

This module holds the event loop, scaling, routing and GPU accounting; the configuration lives in
:mod:`planner.sim.fleet_config`, the replica and scale-event records in :mod:`planner.sim.replica`, the sinks in
:mod:`planner.sim.sinks`. All are re-exported here.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import cast

from planner.discovery import EngineCapacity, Role, WorkerRecord
from planner.errors import ConfigError
from planner.sim.engine import SimEngine, SimRequest
from planner.sim.fleet_config import FleetConfig, RouterKind, StartupMode
from planner.sim.replica import Replica, ReplicaState, ScaleEvent
from planner.sim.sinks import FpmSink, NullSink, StoreSink, ZmqSink
from planner.sim.timing import StepTimer

__all__ = [
    "FleetConfig",
    "FpmSink",
    "NullSink",
    "Replica",
    "ReplicaState",
    "RouterKind",
    "ScaleEvent",
    "SimFleet",
    "StartupMode",
    "StoreSink",
    "ZmqSink",
]

_STEP = 0
_READY = 1
_TRANSFER = 2


class SimFleet:
    """Replicas per role; see the module docstring. ``on_finish`` receives every finished request."""

    def __init__(
        self,
        config: FleetConfig,
        timer: StepTimer,
        *,
        sink: FpmSink | None = None,
        on_finish: Callable[[SimRequest], None] | None = None,
        name: str = "sim",
    ) -> None:
        self.config = config
        self.timer = timer
        self.sink: FpmSink = sink if sink is not None else NullSink()
        self.on_finish = on_finish
        self.name = name
        self.replicas: dict[Role, list[Replica]] = {role: [] for role in config.roles}
        self._desired: dict[Role, int] = dict.fromkeys(config.roles, 0)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._serial = 0
        self._rr: dict[Role, int] = dict.fromkeys(config.roles, 0)
        self.now = 0.0
        self.gpu_s = 0.0
        self._gpu_count = 0
        self._gpu_since = 0.0
        self._gpu_changes: list[tuple[float, int]] = []  # (time, GPUs held from then on), for billing spans
        self.scale_events: list[ScaleEvent] = []
        self.unroutable = 0
        self.steps_total = 0
        self.records: dict[str, WorkerRecord] = {}
        self.on_workers_changed: Callable[[], None] | None = None

    # -- control ---------------------------------------------------------------------------------------------

    def service_name(self, role: Role) -> str:
        return f"{self.config.service_prefix}-{role.value}"

    def desired(self, role: Role) -> int:
        return self._desired[role]

    def counts(self, role: Role) -> dict[ReplicaState, int]:
        out = dict.fromkeys(ReplicaState, 0)
        for rep in self.replicas[role]:
            out[rep.state] += 1
        return out

    def total_replicas(self) -> int:
        """Replicas holding GPUs (starting, ready or draining)."""
        return self._gpu_count

    def scale(self, role: Role, replicas: int, now: float, *, instant: bool = False) -> None:
        """Set the desired count of ``role``. New replicas become ready after the start-up delay (at once with
        ``instant``); removed ones are taken from those still starting first, then the least loaded ready ones,
        which drain (no new requests) and go when empty."""
        if replicas < 0:
            raise ConfigError(f"replicas must be >= 0, got {replicas}")
        if role not in self._desired:
            raise ConfigError(f"role {role} not in this fleet ({', '.join(self._desired)})")
        self.run_until(now)
        current = self._desired[role]
        if replicas == current:
            return
        self.scale_events.append(ScaleEvent(at_s=now, role=role, from_replicas=current, to_replicas=replicas))
        self._desired[role] = replicas
        reps = self.replicas[role]
        live = [r for r in reps if r.state in (ReplicaState.STARTING, ReplicaState.READY)]
        if replicas > len(live):
            for _ in range(replicas - len(live)):
                self._add_replica(role, now, instant)
        else:
            excess = len(live) - replicas
            starting = sorted((r for r in live if r.state is ReplicaState.STARTING), key=lambda r: -r.created_s)
            for rep in starting[:excess]:
                self._set_state(rep, ReplicaState.GONE, now)
            excess -= min(excess, len(starting))
            ready = sorted(
                (r for r in live if r.state is ReplicaState.READY),
                key=lambda r: (r.engine.outstanding_tokens, -r.created_s),
            )
            for rep in ready[:excess]:
                self._set_state(rep, ReplicaState.DRAINING, now)
                if rep.engine.idle and not rep.engine.busy:
                    self._set_state(rep, ReplicaState.GONE, now)
        self.replicas[role] = [r for r in reps if r.state is not ReplicaState.GONE]

    def submit(self, request: SimRequest, now: float) -> bool:
        """Route a new request (to the prefill role when disaggregated); False when no replica can take it or it
        exceeds ``max_model_len`` (counted in :attr:`unroutable`)."""
        self.run_until(now)
        if request.isl + request.osl > self.config.engine.max_model_len:
            self.unroutable += 1
            return False
        if self.config.disaggregated:
            request.prefill_only = True
            return self._route(Role.PREFILL, request, now)
        return self._route(Role.AGG, request, now)

    @property
    def pending_transfers(self) -> bool:
        """KV transfers or replica start-ups still queued in the event heap."""
        return any(kind != _STEP for _, _, kind, _ in self._heap)

    def run_until(self, t: float) -> None:
        """Process every event up to and including time ``t``."""
        heap = self._heap
        while heap and heap[0][0] <= t:
            at, _, kind, obj = heapq.heappop(heap)
            self.now = at
            if kind == _STEP:
                self._step_done(cast(Replica, obj), at)
            elif kind == _READY:
                rep = cast(Replica, obj)
                if rep.state is ReplicaState.STARTING:
                    self._set_state(rep, ReplicaState.READY, at)
            else:
                req = cast(SimRequest, obj)
                req.prefill_only = False
                req.remote_kv = True
                req.arrival_counted = False  # it arrives at a decode engine now
                req.target_prefill = req.isl
                req.done_prefill = 0
                self._route(Role.DECODE, req, at)
        if t > self.now:
            self.now = t

    def heartbeat(self, now: float) -> None:
        """Give every serving engine's sink a chance to send its idle heartbeat."""
        self.run_until(now)
        for reps in self.replicas.values():
            for rep in reps:
                if rep.state in (ReplicaState.READY, ReplicaState.DRAINING):
                    self.sink.idle(rep.engine, now)

    def workers(self) -> Mapping[str, WorkerRecord]:
        """What discovery would report: replicas that are serving (ready or draining)."""
        return self.records

    def gpu_hours(self, now: float) -> float:
        self._account(now)
        return self.gpu_s / 3600.0

    def gpu_hours_between(self, start_s: float, end_s: float) -> float:
        """GPU-hours held over ``[start_s, end_s]``; the count held at the last change continues past it (a
        fleet is billed until ``end_s`` even when the simulation stopped earlier)."""
        if end_s <= start_s:
            return 0.0
        total = 0.0
        count = 0
        since = start_s
        for at, held in self._gpu_changes:
            if at >= end_s:
                break
            if at > since:
                total += count * (at - since)
                since = at
            count = held
        total += count * (end_s - since)
        return total / 3600.0

    def close(self, now: float) -> None:
        for reps in self.replicas.values():
            for rep in reps:
                if rep.state is not ReplicaState.GONE:
                    self._set_state(rep, ReplicaState.GONE, now)

    # -- internals -------------------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, obj: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, obj))

    def _add_replica(self, role: Role, now: float, instant: bool) -> None:
        self._serial += 1
        wid = f"{self.name}-{role.value}-{self._serial}"
        engine = SimEngine(wid, self.config.engine, self.timer, sink=self.sink.step)
        delay = 0.0 if instant else self.config.startup_s
        rep = Replica(engine, role, now, now + delay)
        self.replicas[role].append(rep)
        self._account(now)
        self._gpu_count += self.config.gpus_per_replica
        self._gpu_changes.append((now, self._gpu_count))
        if delay <= 0:
            self._set_state(rep, ReplicaState.READY, now)
        else:
            self._push(now + delay, _READY, rep)

    def _set_state(self, rep: Replica, state: ReplicaState, now: float) -> None:
        old = rep.state
        rep.state = state
        if state is ReplicaState.READY:
            rep.endpoint = self.sink.attach(rep.engine, now)
            cap = self.config.engine
            self.records = {
                **self.records,
                rep.engine.worker_id: WorkerRecord(
                    worker_id=rep.engine.worker_id,
                    role=rep.role,
                    service=self.service_name(rep.role),
                    fpm_endpoints=(rep.endpoint,),
                    capacity=EngineCapacity(
                        max_num_batched_tokens=cap.max_num_batched_tokens,
                        max_num_seqs=cap.max_num_seqs,
                        max_model_len=cap.max_model_len,
                        kv_capacity_tokens=cap.kv_capacity_tokens,
                    ),
                ),
            }
            if self.on_workers_changed is not None:
                self.on_workers_changed()
            if rep.engine.waiting and not rep.engine.busy:
                self._kick(rep, now)
        elif state is ReplicaState.GONE:
            self._account(now)
            self._gpu_count -= self.config.gpus_per_replica
            self._gpu_changes.append((now, self._gpu_count))
            if old in (ReplicaState.READY, ReplicaState.DRAINING):
                self.sink.detach(rep.engine, now)
                self.records = {k: v for k, v in self.records.items() if k != rep.engine.worker_id}
                if self.on_workers_changed is not None:
                    self.on_workers_changed()
            elif old is ReplicaState.STARTING and rep.engine.waiting:
                for req in rep.engine.take_waiting():
                    self._route(rep.role, req, now)

    def _account(self, now: float) -> None:
        if now > self._gpu_since:
            self.gpu_s += self._gpu_count * (now - self._gpu_since)
            self._gpu_since = now

    def _route(self, role: Role, request: SimRequest, now: float) -> bool:
        ready = [r for r in self.replicas[role] if r.state is ReplicaState.READY]
        if not ready:
            # Nothing serving yet: queue on a starting replica (it serves once up) rather than losing the request.
            ready = [r for r in self.replicas[role] if r.state is ReplicaState.STARTING]
            if not ready:
                self.unroutable += 1
                return False
        if self.config.router is RouterKind.ROUND_ROBIN:
            i = self._rr[role] % len(ready)
            self._rr[role] += 1
            rep = ready[i]
        else:
            rep = min(ready, key=lambda r: r.engine.outstanding_tokens)
        rep.engine.add(request)
        if rep.state is ReplicaState.READY and not rep.engine.busy:
            self._kick(rep, now)
        return True

    def _kick(self, rep: Replica, now: float) -> None:
        end = rep.engine.begin_step(now)
        if end is not None:
            self.steps_total += 1
            self._push(end, _STEP, rep)

    def _step_done(self, rep: Replica, at: float) -> None:
        done = rep.engine.end_step(at)
        for req in done:
            if req.prefill_only and self.config.disaggregated:
                self._push(at + self.config.kv_transfer_s, _TRANSFER, req)
            elif self.on_finish is not None:
                self.on_finish(req)
        if rep.state is ReplicaState.GONE:
            return
        self._kick(rep, at)
        if rep.state is ReplicaState.DRAINING and rep.engine.idle and not rep.engine.busy:
            self._set_state(rep, ReplicaState.GONE, at)
            self.replicas[rep.role] = [r for r in self.replicas[rep.role] if r.state is not ReplicaState.GONE]
