"""Driving a :class:`~planner.sim.fleet.SimFleet` in wall-clock time, for ``make demo``.

:class:`RealtimeReplay` replays a trace against a fleet at ``speed`` x real time in a background thread: its
engines publish real FPM over ZMQ (give the fleet a :class:`~planner.sim.fleet.ZmqSink`) and the planner
service subscribes to them like to any vLLM fleet. :class:`SimFleetActuator` is the local actuator: the
service's runner reads replica status from it and scales the fleet through it (thread-safe with the replay).

Usage (demo)::

    sink = ZmqSink(host="127.0.0.1")
    fleet = SimFleet(FleetConfig(cold_start_s=20.0), default_timer(), sink=sink, name="demo")
    replay = RealtimeReplay(fleet, scale_rate(load_trace(path), 4.0), speed=10.0, initial_replicas=2)
    actuator = SimFleetActuator(replay)           # planner.actuators.base.Actuator
    replay.start()
    ...   # fleet.workers() lists the serving engines and their FPM endpoints (register them with the planner)
    replay.stop(); sink.close()

Simulated seconds = wall seconds x ``speed`` since :meth:`RealtimeReplay.start`; start-up delays are in
simulated seconds, so a ``speed`` of 10 turns a 60 s cold start into 6 wall seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from planner.actuators.base import OutcomeKind, ScaleOutcome, ScaleRequest, ServiceStatus, UnknownServiceError
from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError
from planner.sim.engine import SimRequest
from planner.sim.fleet import ReplicaState, SimFleet
from planner.sim.traces import Trace

__all__ = ["RealtimeReplay", "SimFleetActuator"]


class RealtimeReplay:
    """Replays ``trace`` against ``fleet`` at ``speed`` x wall time; loops the trace when ``loop``."""

    def __init__(
        self,
        fleet: SimFleet,
        trace: Trace,
        *,
        speed: float = 1.0,
        initial_replicas: int = 1,
        loop: bool = True,
        interval_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not speed > 0 or not interval_s > 0:
            raise ConfigError("realtime replay needs speed > 0 and interval_s > 0")
        self.fleet = fleet
        self.trace = trace
        self.speed = speed
        self.loop = loop
        self.interval_s = interval_s
        self.clock = clock
        self.lock = threading.RLock()
        self.finished: list[SimRequest] = []
        self._next = 0
        self._offset_s = 0.0
        self._rid = 0
        self._start_wall: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        fleet.on_finish = self._on_finish
        for role in fleet.config.roles:
            fleet.scale(role, initial_replicas, 0.0, instant=True)
        fleet.scale_events.clear()

    def _on_finish(self, req: SimRequest) -> None:
        self.finished.append(req)
        if len(self.finished) > 10_000:
            del self.finished[:5_000]

    def sim_now(self) -> float:
        if self._start_wall is None:
            return 0.0
        return (self.clock() - self._start_wall) * self.speed

    def advance(self, sim_now: float) -> int:
        """Submit every arrival up to ``sim_now`` and run the fleet to it; returns requests submitted."""
        submitted = 0
        with self.lock:
            trace = self.trace
            n = len(trace)
            while n:
                if self._next >= n:
                    if not self.loop:
                        break
                    self._offset_s += trace.duration_s + 1.0
                    self._next = 0
                at = float(trace.arrival_s[self._next]) + self._offset_s
                if at > sim_now:
                    break
                i = self._next
                self.fleet.submit(
                    SimRequest(self._rid, at, int(trace.isl[i]), int(trace.osl[i]), trace.hash_ids[i]), at
                )
                self._rid += 1
                self._next += 1
                submitted += 1
            self.fleet.run_until(sim_now)
            self.fleet.heartbeat(sim_now)
        return submitted

    def start(self) -> None:
        if self._thread is not None:
            return
        self._start_wall = self.clock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sim-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.advance(self.sim_now())

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self.lock:
            self.fleet.close(self.fleet.now)

    def workers(self) -> Mapping[str, WorkerRecord]:
        with self.lock:
            return dict(self.fleet.workers())


class SimFleetActuator:
    """The local actuator (protocol :class:`planner.actuators.base.Actuator`) over a :class:`RealtimeReplay`'s
    fleet. Services are named ``{service_prefix}-{role}`` (``sim-agg`` by default)."""

    def __init__(self, replay: RealtimeReplay, *, max_replicas: int = 64) -> None:
        self.replay = replay
        self.max_replicas = max_replicas

    def _role(self, service: str) -> Role:
        fleet = self.replay.fleet
        for role in fleet.config.roles:
            if fleet.service_name(role) == service:
                return role
        raise UnknownServiceError(f"service {service!r} is not part of this simulated fleet")

    def status(self) -> Mapping[str, ServiceStatus]:
        fleet = self.replay.fleet
        with self.replay.lock:
            out: dict[str, ServiceStatus] = {}
            for role in fleet.config.roles:
                counts = fleet.counts(role)
                ready = counts[ReplicaState.READY]
                name = fleet.service_name(role)
                out[name] = ServiceStatus(
                    service=name,
                    desired=fleet.desired(role),
                    ready=ready,
                    available=ready,
                    updated=ready + counts[ReplicaState.STARTING],
                    state="successful" if ready == fleet.desired(role) else "pending",
                    ready_state=ready == fleet.desired(role),
                )
            return out

    def scale(self, request: ScaleRequest) -> ScaleOutcome:
        role = self._role(request.service)
        fleet = self.replay.fleet
        if not 0 <= request.replicas <= self.max_replicas:
            return ScaleOutcome(
                service=request.service,
                requested=request.replicas,
                applied=False,
                kind=OutcomeKind.OUT_OF_BOUNDS,
                message=f"{request.replicas} is outside [0, {self.max_replicas}]",
            )
        with self.replay.lock:
            previous = fleet.desired(role)
            if previous == request.replicas:
                return ScaleOutcome(
                    service=request.service,
                    requested=request.replicas,
                    applied=False,
                    kind=OutcomeKind.UNCHANGED,
                    previous=previous,
                    target=f"sim/{request.service}",
                )
            fleet.scale(role, request.replicas, max(fleet.now, self.replay.sim_now()))
        return ScaleOutcome(
            service=request.service,
            requested=request.replicas,
            applied=True,
            kind=OutcomeKind.APPLIED,
            previous=previous,
            attempts=1,
            target=f"sim/{request.service}",
        )
