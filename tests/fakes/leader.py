"""A leader elector that stands in for the Kubernetes Lease election (a process boundary): leadership is
whatever the test sets. It offers the one thing the service runner reads, ``is_leader``."""

from __future__ import annotations

__all__ = ["SwitchableElector"]


class SwitchableElector:
    def __init__(self, leader: bool) -> None:
        self.is_leader = leader
