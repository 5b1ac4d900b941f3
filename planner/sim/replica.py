"""A simulated replica's lifecycle record (:class:`Replica`, :class:`ReplicaState`) and the record of one scale
action (:class:`ScaleEvent`); :class:`~planner.sim.fleet.SimFleet` drives the transitions."""

from __future__ import annotations

import enum

import msgspec

from planner.discovery import Role
from planner.sim.engine import SimEngine

__all__ = ["Replica", "ReplicaState", "ScaleEvent"]


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"  # takes no new requests; removed once empty
    GONE = "gone"


class Replica:
    __slots__ = ("created_s", "endpoint", "engine", "ready_s", "role", "state")

    def __init__(self, engine: SimEngine, role: Role, created_s: float, ready_s: float) -> None:
        self.engine = engine
        self.role = role
        self.created_s = created_s
        self.ready_s = ready_s
        self.state = ReplicaState.STARTING
        self.endpoint = ""


class ScaleEvent(msgspec.Struct, frozen=True, kw_only=True):
    at_s: float
    role: Role
    from_replicas: int
    to_replicas: int
