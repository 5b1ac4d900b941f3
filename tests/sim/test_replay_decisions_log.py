"""``fpm-planner replay --decisions-jsonl``: one line per tick and service of ours' decisions, matching what the
replay reports; the flag without ours refused before the run (bad paths: tests/sim/test_replay_cli_checks.py)."""

from __future__ import annotations

import json
from itertools import groupby, pairwise
from pathlib import Path

import msgspec
import pytest

from planner.cli import main
from planner.core import Action
from planner.sim.decision_log import LoggedDecision

SHORT_DISAGG = [
    "replay",
    "--scenario",
    "surge_from_idle",
    "--duration-s",
    "120",
    "--disaggregated",
    "--policy",
    "ours,fixed",
    "--quiet",
]


def test_the_log_has_a_line_per_tick_and_service_that_agrees_with_the_replay(tmp_path: Path) -> None:
    out, log = tmp_path / "out.json", tmp_path / "decisions.jsonl"
    assert main([*SHORT_DISAGG, "--json", str(out), "--decisions-jsonl", str(log)]) == 0
    doc = json.loads(out.read_text())
    lines = [msgspec.json.decode(line, type=LoggedDecision) for line in log.read_bytes().splitlines()]
    services = {x.decision.service for x in lines}
    assert services == {"sim-prefill", "sim-decode"}  # ours only: fixed makes no decisions to log
    ticks = [now for now, _ in groupby(x.now for x in lines)]
    assert ticks == [row[0] for row in doc["timelines"]["ours"]]  # the replay's ticks, in order, none twice
    assert len(lines) == len(ticks) * len(services)
    assert all(x.decision.at == x.now for x in lines)

    moves = [x.decision for x in lines if x.decision.final_replicas != x.decision.current_replicas]
    assert len(moves) == doc["policies"]["ours"]["scale_actions"] > 0
    for service in services:  # each tick starts from the count the previous one set
        own = [x.decision for x in lines if x.decision.service == service]
        pairs = list(pairwise(own))
        assert len(own) == len(ticks) and len(pairs) >= 1
        assert all(b.current_replicas == a.final_replicas for a, b in pairs)

    up = next(d for d in moves if d.action is Action.SCALE_UP)
    assert up.reasons[-1] == "scale_up"
    mover = next(s for s in up.stages if s.replicas != up.current_replicas)  # the stage that asked for more
    assert mover.reason is not None and mover.reason in up.reasons and mover.detail


def test_a_log_without_ours_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "d.jsonl"
    args = ["replay", "--scenario", "surge_from_idle", "--policy", "fixed", "--duration-s", "30", "--quiet"]
    assert main([*args, "--decisions-jsonl", str(log)]) == 2
    out, err = capsys.readouterr()
    assert "add ours to --policy" in err and "attainment" not in out and not log.exists()
