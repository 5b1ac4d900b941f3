"""The demo path: a fleet driven by a (test) clock, scaled through the local actuator, publishing real FPM over
ZMQ that a real subscriber socket receives."""

from __future__ import annotations

import time

import zmq

from planner.actuators.base import Actuator, OutcomeKind, ScaleRequest, UnknownServiceError
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig, SimFleet, ZmqSink
from planner.sim.realtime import RealtimeReplay, SimFleetActuator
from planner.sim.timing import ProfileFitTimer
from planner.sim.traces import synthetic_trace
from worker_shim import fpm

TIMER = ProfileFitTimer(base_s=0.010, a_p=0.0001, a_attn=0.0, a_d=0.001, a_kv=0.0)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_actuator_scales_the_fleet_and_reports_status() -> None:
    clock = Clock()
    fleet = SimFleet(FleetConfig(engine=EngineConfig(prefix_cache=False), cold_start_s=30.0), TIMER)
    replay = RealtimeReplay(
        fleet, synthetic_trace(rate_per_s=[(10.0, 5.0)], isl=100, osl=5), speed=10.0, initial_replicas=1, clock=clock
    )
    actuator = SimFleetActuator(replay)
    assert isinstance(actuator, Actuator)
    status = actuator.status()["sim-agg"]
    assert (status.desired, status.ready) == (1, 1)
    outcome = actuator.scale(ScaleRequest(service="sim-agg", replicas=3))
    assert outcome.kind is OutcomeKind.APPLIED and outcome.previous == 1
    assert actuator.status()["sim-agg"].ready == 1  # the new two are starting
    replay.advance(30.0)  # driven by hand (start() would run it from a thread on the clock)
    assert actuator.status()["sim-agg"].ready == 3
    assert actuator.scale(ScaleRequest(service="sim-agg", replicas=3)).kind is OutcomeKind.UNCHANGED
    assert actuator.scale(ScaleRequest(service="sim-agg", replicas=999)).kind is OutcomeKind.OUT_OF_BOUNDS
    try:
        actuator.scale(ScaleRequest(service="other", replicas=1))
    except UnknownServiceError:
        pass
    else:
        raise AssertionError("unknown service accepted")
    assert len(replay.finished) > 0  # the trace's first 30 s were served


def test_zmq_sink_publishes_real_fpm_a_subscriber_receives() -> None:
    sink = ZmqSink(host="127.0.0.1", heartbeat_interval_s=0.2)
    fleet = SimFleet(FleetConfig(engine=EngineConfig(prefix_cache=False)), TIMER, sink=sink)
    clock = Clock()
    replay = RealtimeReplay(
        fleet,
        synthetic_trace(rate_per_s=[(5.0, 20.0)], isl=100, osl=5),
        speed=1.0,
        initial_replicas=1,
        clock=clock,
        loop=False,
    )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    try:
        (record,) = replay.workers().values()
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 5000)
        sub.connect(record.fpm_endpoints[0])
        time.sleep(0.3)  # slow joiner: let the subscription reach the publisher
        replay.advance(5.0)
        received = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            _, _, payload = fpm.parse_frames(sub.recv_multipart())
            sample = fpm.decode(payload)
            received.append(sample)
            if not sample.is_heartbeat:
                break
        active = [s for s in received if not s.is_heartbeat]
        assert active, "no step sample received"
        assert active[0].worker_id == record.worker_id
        assert active[0].wall_time > 0
    finally:
        sub.close(linger=0)
        replay.stop()
        sink.close()
