"""The Grafana dashboard queries only series the planner really exports, and covers all of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from planner.core import Traffic
from planner.core.decision import Coverage
from planner.discovery import Role
from planner.ingest.subscriber import LinkTotals
from planner.service.metrics import PlannerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fpm-planner.json"
pytestmark = pytest.mark.kubernetes


def exported_names() -> set[str]:
    metrics = PlannerMetrics()
    coverage = Coverage(
        role=Role.DECODE, service="decode", discovered=1, healthy=1, partial=0, silent=0, identity_not_synced=0,
        not_ready=0, ranks_expected=1, ranks_fresh=1, deployment_desired=1, deployment_ready=1, complete=True,
    )  # fmt: skip
    metrics.observe_decision(
        "decode",
        service="decode",
        coverage=coverage,
        current=1,
        recommended=2,
        final=2,
        reasons=("scale_up",),
        ttft_ms=1.0,
        itl_ms=1.0,
    )
    metrics.observe_drops({"unknown_worker": 1})
    metrics.observe_outcome("applied", service="decode")
    metrics.observe_tick(leader=True, completed_at_s=1.0)
    metrics.observe_links(LinkTotals(disconnects=1, reconnects=1, backing_off=1))
    metrics.observe_traffic(
        "decode",
        Traffic(request_rate_per_s=2.0, ttft_ms_p90=100.0, itl_ms_p90=20.0, isl_tokens_p50=100.0,
                osl_tokens_p50=10.0, ttft_attainment_frac=1.0),
    )  # fmt: skip
    metrics.set_paused("decode", False)
    metrics.tick_duration_seconds.observe(0.01)
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def expressions(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def test_dashboard_queries_exported_series_only_and_all_of_them() -> None:
    dash = json.loads(DASHBOARD.read_text())
    used = {m for e in expressions(dash) for m in re.findall(r"\bfpm_planner_[a-z_]+", e)}
    exported = exported_names()
    assert used <= exported, f"not exported by the planner: {sorted(used - exported)}"
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in exported}
    covered = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    assert families <= covered, f"exported but not on the dashboard: {sorted(families - covered)}"


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["targets"] and panel["title"] and set(panel["gridPos"]) == {"x", "y", "w", "h"}
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")")
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance", "role", "service"}
