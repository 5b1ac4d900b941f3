"""Every service-level reason (the tick holds) has a row in docs/reasons.md."""

from __future__ import annotations

import re
from pathlib import Path

from planner.service.deadline import TickHold

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_tick_hold_has_a_row_in_docs_reasons() -> None:
    rows = set(re.findall(r"^\| tick \| `([a-z_]+)` \|", (DOCS / "reasons.md").read_text(), flags=re.MULTILINE))
    assert rows == {h.value for h in TickHold}
