"""Policies side by side on one trace: the hindsight oracle first (it is the yardstick and gives every
dynamic policy its starting count), then fixed peak, HPA, Dynamo rules and ours; summaries, timelines and the
section-7 goals in one JSON-ready document.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from perf_model.api import PerfPredictor
from planner.core import CoreConfig, RoleConfig, SlaTargets, load_config
from planner.discovery import Role
from planner.errors import ConfigError
from planner.sim.decision_log import DecisionSink
from planner.sim.fleet import FleetConfig
from planner.sim.metrics import PolicySummary, SlaConfig, TimelinePoint, summarize
from planner.sim.policies import DynamoRulesPolicy, HpaQueuePolicy, OursPolicy
from planner.sim.replay import OracleResult, Progress, feasible_mask, find_fixed_peak, run_oracle, run_policy
from planner.sim.timing import StepTimer
from planner.sim.traces import Trace

__all__ = ["POLICIES", "CompareSettings", "compare", "ours_core_config"]

POLICIES = ("ours", "fixed", "hpa", "dynamo", "oracle")


class CompareSettings(msgspec.Struct, frozen=True, kw_only=True):
    sla: SlaConfig = SlaConfig()
    fleet: FleetConfig = FleetConfig()
    tick_s: float = 5.0  # ours (the service's default tick)
    oracle_window_s: float = 60.0
    hpa_target_queue_per_replica: float = 5.0
    dynamo_tick_s: float = 5.0
    max_replicas: int = 64
    core_config_path: str | None = None  # YAML/JSON decision-core config for "ours"
    pass_traffic: bool = True


def ours_core_config(settings: CompareSettings) -> CoreConfig:
    """The decision-core config "ours" runs with: the file given, else defaults with the replay's SLA targets
    and replica bounds. A role of the replay's fleet that the file does not name runs with the replay's SLA and
    bound too, as without a file: the core's own default targets (``SlaTargets``: TTFT 500 ms) are not the SLA the
    replay scores, and a file naming only ``agg`` must not judge a disaggregated fleet's prefill against them."""
    role = RoleConfig(
        min_replicas=1,
        max_replicas=settings.max_replicas,
        gpus_per_replica=settings.fleet.gpus_per_replica,
        sla=SlaTargets(ttft_ms=settings.sla.ttft_ms, itl_ms=settings.sla.itl_ms),
    )
    if settings.core_config_path:
        import yaml

        try:
            data = yaml.safe_load(Path(settings.core_config_path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read core config {settings.core_config_path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{settings.core_config_path}: expected a mapping")
        named = data.get("roles")
        config = load_config(data)
        missing = [r for r in settings.fleet.roles if not isinstance(named, dict) or str(r) not in named]
        if not missing:
            return config
        return CoreConfig(roles={**config.roles, **{r: role for r in missing}}, max_total_gpus=config.max_total_gpus)
    return CoreConfig(roles={r: role for r in settings.fleet.roles})


def _timeline_rows(timeline: Sequence[TimelinePoint]) -> list[list[Any]]:
    return [[p.at_s, p.replicas, p.ready, p.arrivals_per_s, p.ttft_p99_ms, p.itl_p99_ms] for p in timeline]


def compare(
    trace: Trace,
    policies: Sequence[str],
    *,
    settings: CompareSettings,
    timer: StepTimer,
    predictors: Mapping[Role, PerfPredictor] | None = None,
    progress: Progress | None = None,
    reuse: Mapping[str, Any] | None = None,
    decision_sink: DecisionSink | None = None,
) -> dict[str, Any]:
    """Run ``policies`` (names from :data:`POLICIES`) on ``trace``; returns the JSON document.

    ``reuse``: an earlier document for the same trace and settings; the policies it holds that are not asked
    for here are carried over (the oracle included, so a new "ours" configuration is compared without
    recomputing the baselines). ``decision_sink``: handed every decision "ours" makes
    (:mod:`planner.sim.decision_log`); the other policies make none."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ConfigError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    started = time.perf_counter()
    sla = settings.sla
    fc = settings.fleet
    feasible = feasible_mask(trace, timer, fc, sla)
    summaries: dict[str, PolicySummary] = {}
    timelines: dict[str, list[list[Any]]] = {}
    extra: dict[str, Any] = {}
    carried: dict[str, PolicySummary] = {}
    if reuse is not None:
        _check_reuse(reuse, trace, settings)
        for name, doc in reuse.get("policies", {}).items():
            if name not in policies and name in POLICIES:
                carried[name] = msgspec.convert(doc, PolicySummary)
                timelines[name] = list(reuse.get("timelines", {}).get(name, []))
                if name in reuse.get("details", {}):
                    extra[name] = reuse["details"][name]
    if "oracle" in carried and "oracle" in extra:
        oracle = OracleResult(
            window_s=float(extra["oracle"]["window_s"]),
            replicas=[int(n) for n in extra["oracle"]["replicas"]],
            gpu_hours=carried["oracle"].gpu_hours,
            wall_s=0.0,
        )
        oracle_out = None
    else:
        oracle, oracle_out = run_oracle(
            trace,
            fleet_config=fc,
            timer=timer,
            sla=sla,
            feasible=feasible,
            window_s=settings.oracle_window_s,
            max_replicas=settings.max_replicas * 4,
            progress=progress,
        )
    oracle_tl = [
        TimelinePoint(
            at_s=(i + 1) * oracle.window_s, replicas=n, ready=n, arrivals_per_s=0.0, ttft_p99_ms=None, itl_p99_ms=None
        )
        for i, n in enumerate(oracle.replicas)
    ]
    if "oracle" in policies and oracle_out is not None:
        summaries["oracle"] = summarize(
            oracle_out,
            sla,
            gpu_hours=oracle.gpu_hours,
            events=(),
            timeline=oracle_tl,
            replay_wall_s=oracle.wall_s,
            oracle_gpu_hours=oracle.gpu_hours,
            scale_actions=sum(1 for a, b in zip(oracle.replicas, oracle.replicas[1:], strict=False) if a != b),
            notes=("per-window fresh fleet, instant scaling: a lower bound",),
        )
        timelines["oracle"] = _timeline_rows(oracle_tl)
        extra["oracle"] = {"window_s": oracle.window_s, "replicas": oracle.replicas}
    initial = oracle.replicas[0] if oracle.replicas else 1
    if "fixed" in policies:
        n, res = find_fixed_peak(
            trace,
            fleet_config=fc,
            timer=timer,
            sla=sla,
            feasible=feasible,
            start=max(oracle.replicas, default=1),
            max_replicas=settings.max_replicas * 4,
            progress=progress,
        )
        summaries["fixed"] = summarize(
            res.outcomes,
            sla,
            gpu_hours=res.gpu_hours,
            events=res.events,
            timeline=res.timeline,
            replay_wall_s=res.wall_s,
            oracle_gpu_hours=oracle.gpu_hours,
            notes=(f"fixed at {n} replicas (smallest meeting the target)",),
        )
        timelines["fixed"] = _timeline_rows(res.timeline)
        extra["fixed"] = {"replicas": n}
    dynamic: list[tuple[str, Any]] = []
    if "hpa" in policies:
        dynamic.append(
            (
                "hpa",
                HpaQueuePolicy(
                    target_queue_per_replica=settings.hpa_target_queue_per_replica, max_replicas=settings.max_replicas
                ),
            )
        )
    if "dynamo" in policies:
        dynamic.append(
            ("dynamo", DynamoRulesPolicy(timer, sla, tick_s=settings.dynamo_tick_s, max_replicas=settings.max_replicas))
        )
    if "ours" in policies:
        dynamic.append(
            (
                "ours",
                OursPolicy(
                    ours_core_config(settings),
                    tick_s=settings.tick_s,
                    predictors=predictors,
                    pass_traffic=settings.pass_traffic,
                    decision_sink=decision_sink,
                ),
            )
        )
    for name, policy in dynamic:
        res = run_policy(
            trace,
            policy,
            fleet_config=fc,
            timer=timer,
            sla=sla,
            feasible=feasible,
            initial_replicas=initial,
            progress=progress,
        )
        notes: tuple[str, ...] = ()
        if isinstance(policy, OursPolicy):
            notes = (
                f"modes {dict(policy.modes)}",
                "top reasons " + ", ".join(f"{k}={v}" for k, v in policy.reasons.most_common(8)),
            )
            sink = res.fleet.sink
            extra["ours"] = {
                "fpm_samples": getattr(sink, "samples", 0),
                "heartbeats": getattr(sink, "heartbeats", 0),
                "fpm_dropped": getattr(sink, "dropped", 0),
                "modes": dict(policy.modes),
                "reasons": dict(policy.reasons),
            }
        summaries[name] = summarize(
            res.outcomes,
            sla,
            gpu_hours=res.gpu_hours,
            events=res.events,
            timeline=res.timeline,
            replay_wall_s=res.wall_s,
            oracle_gpu_hours=oracle.gpu_hours,
            notes=notes,
        )
        timelines[name] = _timeline_rows(res.timeline)
    summaries = {**carried, **summaries}
    ordered = {p: msgspec.to_builtins(summaries[p]) for p in POLICIES if p in summaries}
    return {
        "trace": {
            "name": trace.name,
            "requests": len(trace),
            "duration_s": trace.duration_s,
            "infeasible_requests": int((~feasible).sum()),
        },
        "settings": msgspec.to_builtins(settings),
        "policies": ordered,
        "details": extra,
        "goals": goals(summaries),
        "timelines": timelines,
        "wall_s": time.perf_counter() - started,
    }


def _check_reuse(reuse: Mapping[str, Any], trace: Trace, settings: CompareSettings) -> None:
    got = reuse.get("trace", {})
    if got.get("name") != trace.name or got.get("requests") != len(trace):
        raise ConfigError(
            f"--reuse document is for trace {got.get('name')!r} ({got.get('requests')} requests), "
            f"not {trace.name!r} ({len(trace)} requests)"
        )
    ours = msgspec.to_builtins(settings)
    theirs = dict(reuse.get("settings", {}))
    for key in ("sla", "fleet", "oracle_window_s", "hpa_target_queue_per_replica", "dynamo_tick_s", "max_replicas"):
        if theirs.get(key) != ours.get(key):
            raise ConfigError(f"--reuse document was made with other settings ({key} differs)")


def goals(s: Mapping[str, PolicySummary]) -> dict[str, bool | None]:
    """Section 7 of the issue, each goal True / False, or None when a policy it needs did not run."""
    ours = s.get("ours")
    if ours is None:
        return {}
    out: dict[str, bool | None] = {
        "ours_attainment_ge_0.99": ours.sla_attainment >= 0.99,
        "ours_gpu_hours_le_1.10x_oracle": (
            None if ours.gpu_hours_vs_oracle is None else ours.gpu_hours_vs_oracle <= 1.10
        ),
    }
    fixed = s.get("fixed")
    out["ours_gpu_hours_le_0.75x_fixed"] = None if fixed is None else ours.gpu_hours <= 0.75 * fixed.gpu_hours
    for name in ("hpa", "dynamo"):
        other = s.get(name)
        out[f"ours_better_than_{name}_both_axes"] = (
            None if other is None else ours.sla_attainment >= other.sla_attainment and ours.gpu_hours <= other.gpu_hours
        )
    return out
