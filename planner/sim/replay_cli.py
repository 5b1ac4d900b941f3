"""``fpm-planner replay``: replay a request trace against the planner and the baselines.

    fpm-planner replay --trace PATH --rate-scale K --policy ours,fixed,hpa,dynamo,oracle --json OUT [--report DIR]
    fpm-planner replay --scenario NAME [--seed N] ...     (a synthetic scenario instead of a trace file)

Prints a progress bar on stderr and a one-line summary per policy on stdout; the JSON document has
``{"policies": {"ours": {"sla_attainment", "gpu_hours", "gpu_hours_vs_oracle", "scale_actions", "flaps",
"ttft_p99_ms", "itl_p99_ms", ...}, ...}, "goals": {...}, "timelines": {...}, "settings": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from planner.errors import ConfigError, PlannerError
from planner.sim.compare import POLICIES, CompareSettings, compare
from planner.sim.decision_log import DecisionLog
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig, RouterKind, StartupMode
from planner.sim.metrics import SlaConfig
from planner.sim.predictors import profile_predictors
from planner.sim.scenarios import SCENARIOS, scenario_trace
from planner.sim.timing import DEFAULT_PROFILE_DIR, default_timer, ttft_overhead_s
from planner.sim.traces import compress_time, load_trace, scale_rate

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter  # --help shows every default
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Azure 2023 CSV or Mooncake JSONL trace")
    source.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        help="a deterministic synthetic scenario (seeded by --seed) instead of a trace; see planner/sim/scenarios.py",
    )
    parser.add_argument("--rate-scale", type=float, default=1.0, help="multiply the request rate (same duration)")
    parser.add_argument(
        "--shift-s",
        type=float,
        default=60.0,
        help="rate scaling: copies of the trace shifted by up to +/- shift_s/2 (0 = bursts aligned)",
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="replay this many times faster")
    parser.add_argument("--duration-s", type=float, default=None, help="replay only the first N seconds")
    parser.add_argument("--policy", default=",".join(POLICIES), help=f"comma list of {','.join(POLICIES)}")
    parser.add_argument("--json", dest="json_out", default=None, help="write the result document here")
    parser.add_argument("--report", default=None, help="write an HTML report (inline SVG plots) into this dir")
    parser.add_argument(
        "--decisions-jsonl",
        default=None,
        metavar="PATH",
        help="write every decision of the ours policy (only ours; the other policies are not logged) to this file, "
        'one JSON line per tick and service: {"now": ..., "decision": {...}} (planner/sim/decision_log.py)',
    )
    parser.add_argument("--ttft-ms", type=float, default=2000.0, help="SLA: TTFT target")
    parser.add_argument("--itl-ms", type=float, default=50.0, help="SLA: ITL target")
    parser.add_argument("--attainment", type=float, default=0.99, help="SLA attainment goal (fraction)")
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE_DIR), help="measured profile directory")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="engine: prefill chunk")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="engine: batch size limit")
    parser.add_argument("--no-prefix-cache", action="store_true", help="engine: no prefix caching")
    parser.add_argument(
        "--router", choices=[r.value for r in RouterKind], default=RouterKind.LEAST_TOKENS.value, help="request router"
    )
    parser.add_argument(
        "--startup-mode",
        choices=[m.value for m in StartupMode],
        default=StartupMode.COLD.value,
        help="how a new replica starts",
    )
    parser.add_argument("--cold-start-s", type=float, default=60.0, help="replica start-up, cold")
    parser.add_argument("--restore-start-s", type=float, default=15.0, help="replica start-up, restore")
    parser.add_argument("--disaggregated", action="store_true", help="prefill + decode roles (KV transfer between)")
    parser.add_argument("--kv-transfer-s", type=float, default=0.02, help="disaggregated: KV transfer time")
    parser.add_argument("--tick-s", type=float, default=5.0, help="planner tick (ours)")
    parser.add_argument("--oracle-window-s", type=float, default=60.0, help="oracle: look-ahead window")
    parser.add_argument("--hpa-target-queue", type=float, default=5.0, help="HPA: waiting requests per replica")
    parser.add_argument("--max-replicas", type=int, default=64, help="every policy's replica limit")
    parser.add_argument("--core-config", default=None, help="decision-core config (YAML) for ours")
    parser.add_argument("--no-traffic", action="store_true", help="do not give ours traffic (from FPM)")
    parser.add_argument("--no-perf-model", action="store_true", help="ours without a predictor (threshold mode)")
    parser.add_argument(
        "--reuse",
        default=None,
        help="earlier --json output for the same trace and settings: carry over the policies not "
        "asked for (the oracle included) instead of re-running them",
    )
    parser.add_argument("--seed", type=int, default=0, help="rate scaling and scenario seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


class _Bar:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.started = time.perf_counter()
        self._last = 0.0

    def __call__(self, label: str, frac: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if frac < 1.0 and now - self._last < 0.2:
            return
        self._last = now
        filled = int(frac * 30)
        sys.stderr.write(
            f"\r{label:>7} [{'#' * filled}{'.' * (30 - filled)}] {frac * 100:5.1f}% {now - self.started:6.1f}s"
        )
        if frac >= 1.0:
            sys.stderr.write("\n")
        sys.stderr.flush()


def settings_from_args(args: argparse.Namespace, overhead_s: float) -> CompareSettings:
    engine = EngineConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        prefix_cache=not args.no_prefix_cache,
        ttft_overhead_s=overhead_s,
    )
    fleet = FleetConfig(
        engine=engine,
        cold_start_s=args.cold_start_s,
        restore_start_s=args.restore_start_s,
        startup_mode=StartupMode(args.startup_mode),
        router=RouterKind(args.router),
        disaggregated=args.disaggregated,
        kv_transfer_s=args.kv_transfer_s,
    )
    return CompareSettings(
        sla=SlaConfig(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, attainment_target=args.attainment),
        fleet=fleet,
        tick_s=args.tick_s,
        oracle_window_s=args.oracle_window_s,
        hpa_target_queue_per_replica=args.hpa_target_queue,
        max_replicas=args.max_replicas,
        core_config_path=args.core_config,
        pass_traffic=not args.no_traffic,
    )


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse (ConfigError) output paths that cannot be written, before a run that may take minutes."""
    if args.json_out:
        out = Path(args.json_out)
        if out.is_dir():
            raise ConfigError(f"--json {out}: is a directory; give a file path")
        _writable_dir(out.parent, "--json")
    if args.report:
        report = Path(args.report)
        if report.exists() and not report.is_dir():
            raise ConfigError(f"--report {report}: exists and is not a directory")
        _writable_dir(report, "--report")
    if args.decisions_jsonl:
        log = Path(args.decisions_jsonl)
        if log.is_dir():
            raise ConfigError(f"--decisions-jsonl {log}: is a directory; give a file path")
        _writable_dir(log.parent, "--decisions-jsonl")


def _writable_dir(path: Path, flag: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot create directory {path}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: directory {path} is not writable")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("\nfpm-planner replay: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    decision_log: DecisionLog | None = None
    try:
        check_outputs(args)
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        if args.decisions_jsonl:
            if "ours" not in policies:
                raise ConfigError("--decisions-jsonl logs the ours policy's decisions; add ours to --policy")
            decision_log = DecisionLog(args.decisions_jsonl)  # opened (and a bad path refused) before the replay
        doc = _replay(args, policies, decision_log)
    except PlannerError as exc:
        print(f"fpm-planner replay: {exc}", file=sys.stderr)
        return 2
    finally:
        if decision_log is not None:
            decision_log.close()
    doc["command"] = "fpm-planner replay " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    for name, p in doc["policies"].items():
        ratio = p["gpu_hours_vs_oracle"]
        print(
            f"{name:>7}: attainment {p['sla_attainment'] * 100:6.2f}%  gpu_hours {p['gpu_hours']:7.2f}"
            f"  vs_oracle {'-' if ratio is None else f'{ratio:.3f}'}  actions {p['scale_actions']:4d}"
            f"  flaps {p['flaps']:3d}  ttft_p99 {p['ttft_p99_ms'] or 0:8.1f} ms  itl_p99 {p['itl_p99_ms'] or 0:6.1f} ms"
            f"  wall {p['replay_wall_s']:6.1f}s"
        )
    if doc["goals"]:
        print("goals: " + json.dumps(doc["goals"]))
    if decision_log is not None:
        print(f"decisions: {decision_log.path} ({decision_log.lines} lines)")
    try:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(doc, indent=1, default=str))
        if args.report:
            from planner.sim.report import write_report

            print(f"report: {write_report(args.report, doc)}")
    except OSError as exc:
        print(f"fpm-planner replay: cannot write the output: {exc}", file=sys.stderr)
        return 1
    return 0


def _replay(args: argparse.Namespace, policies: list[str], decision_log: DecisionLog | None) -> dict[str, Any]:
    """Build the trace, settings and predictors from ``args`` and run :func:`compare`; the result document."""
    timer = default_timer(args.profile)
    overhead_s = ttft_overhead_s(timer)
    settings = settings_from_args(args, overhead_s)
    trace = scenario_trace(args.scenario, seed=args.seed) if args.scenario else load_trace(args.trace)
    if args.time_scale != 1.0:
        trace = compress_time(trace, args.time_scale)
    trace = scale_rate(trace, args.rate_scale, seed=args.seed, shift_s=args.shift_s)
    if args.duration_s is not None:
        n = int(np.searchsorted(trace.arrival_s, args.duration_s, side="right"))
        if n == 0:
            raise ConfigError(f"no requests in the first {args.duration_s} s")
        trace = msgspec.structs.replace(
            trace, arrival_s=trace.arrival_s[:n], isl=trace.isl[:n], osl=trace.osl[:n], hash_ids=trace.hash_ids[:n]
        )
    predictors = None if args.no_perf_model else profile_predictors(args.profile, settings)
    reuse = None
    if args.reuse:
        try:
            reuse = json.loads(Path(args.reuse).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read --reuse {args.reuse}: {exc}") from exc
    doc = compare(
        trace,
        policies,
        settings=settings,
        timer=timer,
        predictors=predictors,
        progress=_Bar(not args.quiet),
        reuse=reuse,
        decision_sink=decision_log,
    )
    doc["timer"] = type(timer).__name__
    return doc
