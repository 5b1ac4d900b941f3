"""Every service-level reason (the tick holds) and every ingest drop reason has a row in docs/reasons.md."""

from __future__ import annotations

import re
from pathlib import Path

from planner.ingest.drops import DropReason
from planner.service.deadline import TickHold

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _rows(where: str) -> set[str]:
    text = (DOCS / "reasons.md").read_text()
    return set(re.findall(rf"^\| {where} \| `([a-z_]+)` \|", text, flags=re.MULTILINE))


def test_every_tick_hold_has_a_row_in_docs_reasons() -> None:
    assert _rows("tick") == {h.value for h in TickHold}


def test_every_drop_reason_has_a_row_in_docs_reasons() -> None:
    assert _rows("drop") == {r.value for r in DropReason}
