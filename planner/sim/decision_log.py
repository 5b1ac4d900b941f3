"""The per-tick decision log of a replay (``fpm-planner replay --decisions-jsonl PATH``): why "ours" scaled when
it did.

:class:`OursPolicy <planner.sim.policies.OursPolicy>` hands every :class:`~planner.core.Decision` of every tick
to an optional :data:`DecisionSink` (``sink(now, decision)``); :class:`DecisionLog` is the sink that writes them
to a file, one :class:`LoggedDecision` per line, JSON encoded by msgspec::

    {"now": 35.0, "decision": {"id": "6-sim-agg", "tick": 6, "service": "sim-agg", "current_replicas": 2,
     "final_replicas": 3, "action": "scale_up", "reasons": [...], "stages": [...], "coverage": {...}, ...}}

``decision`` is the core's own record, whole (docs/decision_core.md, reasons in docs/reasons.md); a line decodes
back with ``msgspec.json.decode(line, type=LoggedDecision)``. Lines are buffered and flushed when the log is
closed (``fpm-planner replay`` closes it in a ``finally``: when the replay fails too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import msgspec

from planner.core import Decision
from planner.errors import ConfigError

__all__ = ["DecisionLog", "DecisionSink", "LoggedDecision"]

DecisionSink = Callable[[float, Decision], None]
"""Called with the simulated time and each decision of a tick, in the order the core returned them."""


class LoggedDecision(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the log: the simulated time of the tick and the decision made at it."""

    now: float
    decision: Decision


class DecisionLog:
    """A :data:`DecisionSink` writing JSON lines to ``path`` (created or truncated when opened).

    Raises :class:`~planner.errors.ConfigError` when the file cannot be opened, so a bad path is refused
    before the replay starts."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: BinaryIO = self.path.open("wb")
        except OSError as exc:
            raise ConfigError(f"--decisions-jsonl: cannot write {self.path}: {exc.strerror or exc}") from exc
        self._encoder = msgspec.json.Encoder()
        self.lines = 0

    def __call__(self, now: float, decision: Decision) -> None:
        self._file.write(self._encoder.encode(LoggedDecision(now=now, decision=decision)) + b"\n")
        self.lines += 1

    def close(self) -> None:
        self._file.close()
