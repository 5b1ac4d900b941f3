"""Logs that explain: one structured line per decision that changes something or holds for a new reason.

:class:`DecisionLog` keeps, per service, the last logged ``(action, final, reasons)``; a decision with the same
key is not logged again (an advisory planner that would scale every tick says so once, a hold says why once
and again only when the why changes). Each line is logged on ``planner.decisions`` with the decision's fields
as the record's ``extra`` (``decision_id``, ``service``, ``role``, ``action``, ``current``, ``recommended``,
``final``, ``reasons`` — the reason chain in pipeline order —, ``leader``, ``summary``), so the JSON formatter
(:func:`configure_logging` with ``json_logs=True``, python-json-logger) writes them as keys.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from pythonjsonlogger.json import JsonFormatter

from planner.core import Decision

__all__ = ["DecisionLog", "configure_logging"]

log = logging.getLogger("planner.decisions")

_PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str = "info", *, json_logs: bool = False) -> None:
    """The root logger: plain text, or one JSON object per line (``extra`` fields become keys)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(
            JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"})
        )
    else:
        handler.setFormatter(logging.Formatter(_PLAIN))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class DecisionLog:
    """See the module docstring."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, int, tuple[str, ...]]] = {}

    def observe(self, decisions: Iterable[Decision], *, leader: bool, advisory: bool) -> list[Decision]:
        """Log the decisions that are new (see the module docstring); returns them."""
        logged = []
        for d in decisions:
            reasons = tuple(r.value for r in d.reasons)
            key = (d.action.value, d.final_replicas, reasons)
            if self._last.get(d.service) == key:
                continue
            self._last[d.service] = key
            logged.append(d)
            verb = "hold" if d.action.value == "hold" else f"scale {d.current_replicas} -> {d.final_replicas}"
            mode = " (advisory)" if advisory else "" if leader else " (follower: not applied)"
            log.info(
                "%s %s%s because %s: %s",
                d.service,
                verb,
                mode,
                " > ".join(reasons),
                d.summary,
                extra={
                    "decision_id": d.id,
                    "service": d.service,
                    "role": d.role.value,
                    "action": d.action.value,
                    "current": d.current_replicas,
                    "recommended": d.recommended_replicas,
                    "final": d.final_replicas,
                    "reasons": list(reasons),
                    "leader": leader,
                    "advisory": advisory,
                    "summary": d.summary,
                },
            )
        return logged
