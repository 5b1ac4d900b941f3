"""The chart's PrometheusRule: off by default; when on, one alert per failure an operator must hear about, each
querying only series the planner really exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.core.decision import Coverage
from planner.discovery import Role
from planner.service.metrics import PlannerMetrics

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "fpm-planner"
pytestmark = pytest.mark.kubernetes


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def lookup(path: str, vals: dict[str, Any]) -> Any:
    cur: Any = vals
    for key in path.removeprefix(".Values.").split("."):
        cur = cur[key]
    return cur


def render(vals: dict[str, Any]) -> dict[str, Any] | None:
    """Render templates/prometheusrule.yaml for ``vals``: the few directives it uses (one ``if`` around the
    whole file, ``include``/``with`` for labels, values, ``mul``, and raw ``{{` ... `}}`` strings)."""
    text = (CHART / "templates" / "prometheusrule.yaml").read_text()
    m = re.fullmatch(r"\{\{- if (\S+) \}\}\n(.*)\{\{- end \}\}\n", text, re.S)
    assert m is not None, "the template is one if-block"
    if not lookup(m.group(1), vals):
        return None
    body = m.group(2)
    body = re.sub(r"\n\s*\{\{- with [^}]*\}\}.*?\{\{- end \}\}", "", body, flags=re.S)
    body = re.sub(r"\n\s*\{\{- include [^}]*\}\}", "", body)
    body = re.sub(r"\{\{`(.*?)`\}\}", lambda r: r.group(1).replace("{{", "\0").replace("}}", "\1"), body)
    body = re.sub(
        r"\{\{ mul (\S+) (\S+) \}\}", lambda r: str(int(lookup(r.group(1), vals)) * int(lookup(r.group(2), vals))), body
    )
    body = re.sub(r"\{\{ (\.Values\.\S+) \}\}", lambda r: str(lookup(r.group(1), vals)), body)
    body = re.sub(r"\{\{ include [^}]*\}\}|\{\{ \.Release\.Namespace \}\}", "x", body)
    assert "{{" not in body, f"unrendered directive: {body[body.index('{{') :][:80]}"
    doc: dict[str, Any] = yaml.safe_load(body.replace("\0", "{{").replace("\1", "}}"))
    return doc


def exported_families() -> set[str]:
    metrics = PlannerMetrics()
    coverage = Coverage(
        role=Role.DECODE, service="decode", discovered=1, healthy=1, partial=0, silent=0, identity_not_synced=0,
        not_ready=0, ranks_expected=1, ranks_fresh=1, deployment_desired=1, deployment_ready=1, complete=True,
    )  # fmt: skip
    metrics.observe_decision(
        "decode", service="decode", coverage=coverage, current=1, recommended=1, final=1, reasons=("hold",),
        ttft_ms=None, itl_ms=None,
    )  # fmt: skip
    metrics.observe_outcome("applied", service="decode")
    metrics.observe_tick(leader=True, completed_at_s=1.0)
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_rule_is_off_by_default() -> None:
    assert render(values()) is None


def test_the_rules_alert_on_what_an_operator_must_hear_about_with_exported_series() -> None:
    vals = values()
    vals["prometheusRule"]["enabled"] = True
    doc = render(vals)
    assert doc is not None and doc["kind"] == "PrometheusRule"
    rules = doc["spec"]["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [
        "FpmPlannerIdentityNotSynced",
        "FpmPlannerBlind",
        "FpmPlannerCappedAtMaxWithPredictedMiss",
        "FpmPlannerActuatorFailing",
        "FpmPlannerNoLeader",
    ]
    exported = exported_families()
    for rule in rules:
        expr = rule["expr"]
        used = set(re.findall(r"\bfpm_planner_[a-z_]+", expr))
        assert used and used <= exported, f"{rule['alert']}: not exported: {sorted(used - exported)}"
        assert expr.count("(") == expr.count(")")
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), rule["for"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert "{{ $labels" in rule["annotations"]["summary"] or rule["alert"] == "FpmPlannerNoLeader"
    blind = next(r for r in rules if r["alert"] == "FpmPlannerBlind")
    assert blind["for"] == f"{vals['prometheusRule']['blindTicks'] * vals['planner']['tickIntervalS']}s"
    assert "6 ticks" in blind["annotations"]["summary"]
