"""Lease leader election with two planner replicas against the API emulator, on a fake clock: one acts; when it
stops, the other takes over within the lease duration; at no instant do both act."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from planner.actuators.base import OutcomeKind, ReplicaBounds, ScaleRequest
from planner.actuators.kubernetes import KubernetesActuator, KubernetesActuatorConfig, ScaleTarget, TargetKind
from planner.k8s.leader import LeaderElectionConfig, LeaseElector
from tests.fakes.k8s_api import Fault, K8sApiEmulator
from tests.k8s.k8s_support import NS, FakeSleep, deployment

pytestmark = pytest.mark.kubernetes

LEASE_S, RENEW_S, RETRY_S = 15.0, 10.0, 2.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.8e9 + self.t


class Replica:
    """One planner replica: an elector and an actuator sharing one client (User-Agent = identity)."""

    def __init__(self, identity: str, make_client: Callable[..., k8s.ApiClient], clock: FakeClock) -> None:
        self.identity = identity
        api = make_client(user_agent=identity)
        self.events: list[str] = []
        self.elector = LeaseElector(
            api,
            LeaderElectionConfig(
                namespace=NS,
                identity=identity,
                lease_duration_s=LEASE_S,
                renew_deadline_s=RENEW_S,
                retry_period_s=RETRY_S,
            ),
            clock=clock,
            wall_clock=clock.wall,
            on_started_leading=lambda: self.events.append("started"),
            on_stopped_leading=lambda: self.events.append("stopped"),
        )
        target = ScaleTarget(
            service="agg",
            kind=TargetKind.DEPLOYMENT,
            name="vllm-agg",
            bounds=ReplicaBounds(min_replicas=1, max_replicas=10),
        )
        self.actuator = KubernetesActuator(
            api, KubernetesActuatorConfig(namespace=NS, targets=(target,)), sleep=FakeSleep()
        )
        self.alive = True

    def tick(self, replicas: int) -> bool:
        """One runner tick: an election round, then act only when leader. Returns whether it acted."""
        if not self.alive:
            return False
        self.elector.try_acquire_or_renew()
        if not self.elector.is_leader:
            return False
        out = self.actuator.scale(ScaleRequest(service="agg", replicas=replicas, reason=self.identity))
        return out.kind in (OutcomeKind.APPLIED, OutcomeKind.UNCHANGED)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pair(
    emulator: K8sApiEmulator, make_client: Callable[..., k8s.ApiClient], clock: FakeClock
) -> tuple[Replica, Replica]:
    emulator.put(deployment("vllm-agg", 1))
    return Replica("planner-a", make_client, clock), Replica("planner-b", make_client, clock)


def lease(emulator: K8sApiEmulator) -> dict[str, Any]:
    obj = emulator.get("leases", NS, "fpm-planner-leader")
    assert obj is not None
    return obj


def run_ticks(a: Replica, b: Replica, clock: FakeClock, seconds: float, log: list[tuple[float, str, str]]) -> None:
    """Both replicas tick every retry period; after each tick, check that at most one believes it leads."""
    end = clock.t + seconds
    while clock.t < end:
        for r, replicas in ((a, 2), (b, 3)):
            if r.tick(replicas):
                log.append((clock.t, r.identity, "acted"))
            leaders = [x.identity for x in (a, b) if x.alive and x.elector.is_leader]
            assert len(leaders) <= 1, f"both lead at t={clock.t}: {leaders}"
        clock.t += RETRY_S


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="renew_deadline_s"):
        LeaderElectionConfig(namespace=NS, identity="a", lease_duration_s=10, renew_deadline_s=10)


def test_one_acts_then_the_other_takes_over_within_the_lease_duration(
    emulator: K8sApiEmulator, pair: tuple[Replica, Replica], clock: FakeClock
) -> None:
    a, b = pair
    log: list[tuple[float, str, str]] = []
    run_ticks(a, b, clock, 30, log)
    assert {who for _, who, _ in log} == {"planner-a"}  # only the first replica acted
    assert lease(emulator)["spec"]["holderIdentity"] == "planner-a"
    assert b.elector.observed_holder == "planner-a"
    last_renew = clock.t - RETRY_S
    a.alive = False  # the leader's process dies: no release, no more renewals
    run_ticks(a, b, clock, 40, log)
    takeover = min(t for t, who, _ in log if who == "planner-b")
    assert last_renew < takeover <= last_renew + LEASE_S + RETRY_S
    assert lease(emulator)["spec"]["holderIdentity"] == "planner-b"
    assert lease(emulator)["spec"]["leaseTransitions"] == 1
    # The writes the API server saw: all of A's, then all of B's, never interleaved.
    writers = [ua for m, p, ua in emulator.request_log if m == "PUT" and p.endswith("/scale")]
    assert writers == sorted(writers) and set(writers) == {"planner-a", "planner-b"}
    obj = emulator.get("deployments", NS, "vllm-agg")
    assert obj is not None and obj["spec"]["replicas"] == 3
    assert b.events == ["started"]


def test_clean_step_down_hands_over_at_once(
    emulator: K8sApiEmulator, pair: tuple[Replica, Replica], clock: FakeClock
) -> None:
    a, b = pair
    assert a.elector.try_acquire_or_renew() is True
    assert b.elector.try_acquire_or_renew() is False
    clock.t += RETRY_S
    assert a.elector.release() is True
    assert a.elector.is_leader is False and a.events == ["started", "stopped"]
    assert lease(emulator)["spec"].get("holderIdentity") is None
    # No waiting out the lease: the next round of the follower takes it.
    assert b.elector.try_acquire_or_renew() is True
    assert lease(emulator)["spec"]["holderIdentity"] == "planner-b"
    assert a.elector.try_acquire_or_renew() is False


def test_a_partitioned_leader_stops_acting_before_anyone_else_may_start(
    emulator: K8sApiEmulator, pair: tuple[Replica, Replica], clock: FakeClock
) -> None:
    a, b = pair
    log: list[tuple[float, str, str]] = []
    run_ticks(a, b, clock, 10, log)
    assert a.elector.is_leader
    # A can no longer reach the API server (its requests time out / fail); B still can.
    emulator.inject(Fault("*", r"", status=503, times=None, user_agent="planner-a"))
    partitioned_at = clock.t
    run_ticks(a, b, clock, 40, log)  # asserts at every tick that they never both lead
    assert a.events == ["started", "stopped"]
    assert b.elector.is_leader
    a_acts = [t for t, who, _ in log if who == "planner-a" and t >= partitioned_at]
    b_first = min(t for t, who, _ in log if who == "planner-b")
    assert not any(t >= b_first for t in a_acts)  # none at all is fine: it stopped acting
    assert a.elector.last_error is not None and "503" in a.elector.last_error
    # The partition heals: A sees B's lease and stays a follower.
    emulator.clear_faults()
    assert a.elector.try_acquire_or_renew() is False
    assert a.elector.observed_holder == "planner-b"


def test_leadership_lapses_on_the_clock_even_without_a_round(pair: tuple[Replica, Replica], clock: FakeClock) -> None:
    a, _ = pair
    assert a.elector.try_acquire_or_renew() is True
    clock.t += RENEW_S - 0.1
    assert a.elector.is_leader  # still inside the renew deadline
    clock.t += 0.2
    assert not a.elector.is_leader  # a stalled loop cannot keep acting


def test_threaded_run_and_stop_release(emulator: K8sApiEmulator, make_client: Callable[..., k8s.ApiClient]) -> None:
    """The real loop in a thread (real clock, short periods): it leads, then stop() releases the Lease."""
    api = make_client(user_agent="planner-t")
    started = threading.Event()
    elector = LeaseElector(
        api,
        LeaderElectionConfig(
            namespace=NS, identity="planner-t", lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.05
        ),
        on_started_leading=started.set,
    )
    elector.start()
    try:
        if not started.wait(10):
            raise AssertionError("never became leader")
        assert elector.is_leader
    finally:
        elector.stop(release=True)
    assert not elector.is_leader
    assert lease(emulator)["spec"].get("holderIdentity") is None


def test_a_leader_that_sees_another_holder_steps_down_at_once(
    emulator: K8sApiEmulator, pair: tuple[Replica, Replica], clock: FakeClock
) -> None:
    a, _ = pair
    assert a.elector.try_acquire_or_renew()
    # An operator hands the Lease to someone else (or it was recreated): A must not wait for its deadline.
    obj = lease(emulator)
    obj["spec"]["holderIdentity"] = "planner-z"
    emulator.put(obj)
    clock.t += RETRY_S
    assert a.elector.try_acquire_or_renew() is False
    assert not a.elector.is_leader and a.events == ["started", "stopped"]
