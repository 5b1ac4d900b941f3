"""Every reason and every stage is documented (docs/reasons.md, docs/decision_core.md)."""

from __future__ import annotations

import re
from pathlib import Path

from planner.core import Reason, Stage

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_reason_has_a_row_in_docs_reasons() -> None:
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", (DOCS / "reasons.md").read_text(), flags=re.MULTILINE))
    assert {r.value for r in Reason} - rows == set()
    assert rows - {r.value for r in Reason} == set()


def test_every_stage_is_in_the_pipeline_table() -> None:
    text = (DOCS / "decision_core.md").read_text()
    assert [s.value for s in Stage if f"| `{s.value}` |" not in text] == []
