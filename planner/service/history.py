"""Bounded history of decisions and actuator outcomes, with ids, for the API and the diagnostics page.

Pure containers: the runner stamps the times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from planner.core.decision import Decision
from planner.core.observation import Traffic

__all__ = ["DecisionEntry", "History", "OutcomeEntry"]


class DecisionEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One service's decision at one tick, with the core's full record."""

    id: int
    tick: int
    role: str
    service: str
    decided_at_s: float  # wall clock, Unix seconds
    leader: bool  # whether this planner acted on it
    current: int
    recommended: int
    final: int
    action: str  # scale_up | scale_down | hold
    reasons: tuple[str, ...]
    summary: str  # the decision in words
    decision: Decision  # the core's full record
    traffic: Traffic | None = None  # the traffic window the core read for this role (FPM, or given); None: none


class OutcomeEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one scale request (or why none was sent)."""

    id: int
    decision_id: int | None
    role: str
    service: str
    at_s: float  # wall clock, Unix seconds
    requested: int
    kind: str  # planner.actuators.base.OutcomeKind, or "error" when the actuator raised
    applied: bool
    message: str
    outcome: dict[str, Any]


class History:
    """The last ``max_decisions`` decisions and ``max_outcomes`` outcomes, oldest first."""

    def __init__(self, *, max_decisions: int, max_outcomes: int) -> None:
        self._decisions: deque[DecisionEntry] = deque(maxlen=max_decisions)
        self._by_id: dict[int, DecisionEntry] = {}
        self._outcomes: deque[OutcomeEntry] = deque(maxlen=max_outcomes)
        self._latest: dict[str, DecisionEntry] = {}
        self._next_decision = 1
        self._next_outcome = 1

    def next_decision_id(self) -> int:
        value = self._next_decision
        self._next_decision += 1
        return value

    def next_outcome_id(self) -> int:
        value = self._next_outcome
        self._next_outcome += 1
        return value

    def add_decision(self, entry: DecisionEntry) -> None:
        if len(self._decisions) == self._decisions.maxlen:
            self._by_id.pop(self._decisions[0].id, None)
        self._decisions.append(entry)
        self._by_id[entry.id] = entry

    def set_latest(self, entries: Iterable[DecisionEntry]) -> None:
        """The decisions of the last tick, one per service (a service no longer decided drops out)."""
        self._latest = {entry.service: entry for entry in entries}

    def add_outcome(self, entry: OutcomeEntry) -> None:
        self._outcomes.append(entry)

    def decision(self, decision_id: int) -> DecisionEntry | None:
        return self._by_id.get(decision_id)

    def latest(self) -> tuple[DecisionEntry, ...]:
        return tuple(sorted(self._latest.values(), key=lambda e: (e.role, e.service)))

    def decisions(
        self, *, role: str | None = None, since_s: float | None = None, limit: int = 100
    ) -> tuple[DecisionEntry, ...]:
        """Newest first, filtered by role and by ``decided_at_s > since_s``."""
        out: list[DecisionEntry] = []
        for entry in reversed(self._decisions):
            if len(out) >= limit:
                break
            if since_s is not None and entry.decided_at_s <= since_s:
                break
            if role is None or entry.role == role:
                out.append(entry)
        return tuple(out)

    def outcomes(self, limit: int = 100) -> tuple[OutcomeEntry, ...]:
        """Newest first."""
        return tuple(_take(reversed(self._outcomes), limit))

    def __len__(self) -> int:
        return len(self._decisions)


def _take(items: Iterable[OutcomeEntry], limit: int) -> list[OutcomeEntry]:
    out: list[OutcomeEntry] = []
    for item in items:
        if len(out) >= limit:
            break
        out.append(item)
    return out
