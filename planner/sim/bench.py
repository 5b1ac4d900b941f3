"""``fpm-planner bench replay``: how long a one-hour trace takes to replay, per policy.

Replays the Azure 2023 code trace (57 minutes) at a rate scale that needs 10-30 replicas (default 40x) under
each policy named (default ``ours``: real FPM into the FleetStore and the decision core every 5 s, the most
expensive one) and prints one JSON line: wall and process-CPU seconds per policy, simulated engine steps,
FPM samples, requests and the replica range. Target: under 180 s for one policy on one core.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from planner.errors import PlannerError
from planner.sim.compare import CompareSettings, ours_core_config
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig
from planner.sim.policies import DynamoRulesPolicy, FixedPolicy, HpaQueuePolicy, OursPolicy, Policy
from planner.sim.predictors import profile_predictors
from planner.sim.replay import feasible_mask, run_policy
from planner.sim.timing import DEFAULT_PROFILE_DIR, default_timer, ttft_overhead_s
from planner.sim.traces import load_trace, scale_rate

__all__ = ["add_arguments", "run"]

DEFAULT_TRACE = DEFAULT_PROFILE_DIR.parents[1] / "traces" / "azure_llm_2023_code.csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--rate-scale", type=float, default=40.0)
    parser.add_argument("--policy", default="ours", help="comma list of ours, fixed, hpa, dynamo")
    parser.add_argument("--fixed-replicas", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")


def run(args: argparse.Namespace) -> int:
    try:
        timer = default_timer(DEFAULT_PROFILE_DIR)
        overhead_s = ttft_overhead_s(timer)
        settings = CompareSettings(fleet=FleetConfig(engine=EngineConfig(ttft_overhead_s=overhead_s)))
        load_started = time.perf_counter()
        trace = scale_rate(load_trace(args.trace), args.rate_scale)
        load_s = time.perf_counter() - load_started
        feasible = feasible_mask(trace, timer, settings.fleet, settings.sla)
        figures: dict[str, object] = {
            "trace": Path(args.trace).name,
            "rate_scale": args.rate_scale,
            "requests": len(trace),
            "trace_duration_s": round(trace.duration_s, 1),
            "timer": type(timer).__name__,
            "load_trace_s": round(load_s, 2),
            "target_s": 180.0,
        }
        for name in [p.strip() for p in args.policy.split(",") if p.strip()]:
            policy: Policy
            if name == "ours":
                policy = OursPolicy(
                    ours_core_config(settings), predictors=profile_predictors(DEFAULT_PROFILE_DIR, settings)
                )
            elif name == "fixed":
                policy = FixedPolicy(args.fixed_replicas)
            elif name == "hpa":
                policy = HpaQueuePolicy()
            elif name == "dynamo":
                policy = DynamoRulesPolicy(timer, settings.sla)
            else:
                raise PlannerError(f"unknown policy {name!r} (ours, fixed, hpa, dynamo)")
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            res = run_policy(
                trace,
                policy,
                fleet_config=settings.fleet,
                timer=timer,
                sla=settings.sla,
                feasible=feasible,
                initial_replicas=args.fixed_replicas if name == "fixed" else 4,
            )
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
            replicas = [p.replicas for p in res.timeline]
            sink = res.fleet.sink
            figures[name] = {
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "engine_steps": res.fleet.steps_total,
                "fpm_samples": getattr(sink, "samples", None),
                "replicas_min": min(replicas, default=0),
                "replicas_max": max(replicas, default=0),
                "under_target": cpu < 180.0,
            }
    except PlannerError as exc:
        print(f"fpm-planner bench replay: {exc}")
        return 2
    print(json.dumps(figures))
    return 0
