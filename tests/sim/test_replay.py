"""End to end: the replay command on a small synthetic trace, every policy side by side; "ours" runs the real
FleetStore + decision core on FPM from the simulated engines."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from planner.cli import main
from planner.core import CoreConfig, PolicyKind, RoleConfig, ScaleRules, ScalingPolicy, SlaTargets
from planner.discovery import Role
from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig
from planner.sim.metrics import SlaConfig
from planner.sim.policies import OursPolicy
from planner.sim.replay import feasible_mask, run_oracle, run_policy
from planner.sim.timing import ProfileFitTimer
from planner.sim.traces import synthetic_trace

KEYS = {"sla_attainment", "gpu_hours", "gpu_hours_vs_oracle", "scale_actions", "flaps", "ttft_p99_ms", "itl_p99_ms"}


def write_azure(path: Path, arrivals: np.ndarray, isl: int, osl: int) -> None:
    t0 = dt.datetime(2023, 11, 16, 18, 0, 0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for a in arrivals.tolist():
        lines.append(f"{(t0 + dt.timedelta(seconds=a)).isoformat(sep=' ')},{isl},{osl}")
    path.write_text("\n".join(lines) + "\n")


def test_replay_command_writes_every_policy_and_a_report(tmp_path: Path) -> None:
    trace = synthetic_trace(rate_per_s=[(30.0, 5.0), (60.0, 40.0), (30.0, 5.0)], isl=1000, osl=10, seed=4)
    csv = tmp_path / "trace.csv"
    write_azure(csv, trace.arrival_s, 1000, 10)
    out = tmp_path / "out.json"
    code = main(
        [
            "replay",
            "--trace",
            str(csv),
            "--policy",
            "ours,fixed,hpa,dynamo,oracle",
            "--json",
            str(out),
            "--report",
            str(tmp_path / "rep"),
            "--cold-start-s",
            "20",
            "--quiet",
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"ours", "fixed", "hpa", "dynamo", "oracle"}
    for summary in doc["policies"].values():
        assert KEYS <= set(summary)
        assert 0.0 <= summary["sla_attainment"] <= 1.0
    assert doc["policies"]["oracle"]["gpu_hours_vs_oracle"] == 1.0
    assert doc["policies"]["fixed"]["sla_attainment"] >= 0.99
    assert doc["details"]["ours"]["fpm_samples"] > 0
    assert doc["details"]["ours"]["fpm_dropped"] == 0
    html = (tmp_path / "rep" / "index.html").read_text()
    assert html.count("<svg") == 4
    # re-run only "ours" with another core config; the other policies are carried over
    cfg = tmp_path / "core.yaml"
    cfg.write_text("roles:\n  agg:\n    mode: threshold\n")
    again = tmp_path / "again.json"
    code = main(
        [
            "replay",
            "--trace",
            str(csv),
            "--policy",
            "ours",
            "--reuse",
            str(out),
            "--core-config",
            str(cfg),
            "--json",
            str(again),
            "--cold-start-s",
            "20",
            "--quiet",
        ]
    )
    assert code == 0
    doc2 = json.loads(again.read_text())
    assert set(doc2["policies"]) == {"ours", "fixed", "hpa", "dynamo", "oracle"}
    assert doc2["policies"]["fixed"] == doc["policies"]["fixed"]
    modes = doc2["details"]["ours"]["modes"]
    assert list(modes) == ["threshold"] and modes["threshold"] > 0  # every decision (one at least) in threshold
    # a document from another trace is refused
    other = tmp_path / "other.csv"
    write_azure(other, np.array([0.0, 1.0]), 10, 2)
    assert main(["replay", "--trace", str(other), "--policy", "ours", "--reuse", str(out), "--quiet"]) == 2


def test_replay_command_refuses_bad_input(tmp_path: Path, capsys: object) -> None:
    missing = tmp_path / "nope.csv"
    assert main(["replay", "--trace", str(missing), "--quiet"]) == 2
    csv = tmp_path / "t.csv"
    write_azure(csv, np.array([0.0, 1.0]), 10, 2)
    assert main(["replay", "--trace", str(csv), "--policy", "ours,magic", "--quiet"]) == 2


def test_ours_scales_out_on_a_load_step_and_back_in_after_it() -> None:
    timer = ProfileFitTimer.from_dir()
    fleet_cfg = FleetConfig(engine=EngineConfig(ttft_overhead_s=timer.ttft_overhead_s), cold_start_s=20.0)
    sla = SlaConfig()
    trace = synthetic_trace(rate_per_s=[(30.0, 5.0), (120.0, 80.0), (180.0, 5.0)], isl=2000, osl=10, seed=5)
    feasible = feasible_mask(trace, timer, fleet_cfg, sla)
    quick_down = ScaleRules(
        stabilization_window_s=60.0, policies=(ScalingPolicy(kind=PolicyKind.PERCENT, value=100.0, period_s=15.0),)
    )
    config = CoreConfig(
        roles={Role.AGG: RoleConfig(sla=SlaTargets(ttft_ms=2000, itl_ms=50), max_replicas=32, scale_down=quick_down)}
    )
    ours = OursPolicy(config)
    res = run_policy(trace, ours, fleet_config=fleet_cfg, timer=timer, sla=sla, feasible=feasible, initial_replicas=1)
    replicas = [p.replicas for p in res.timeline]
    assert max(replicas) >= 3  # scaled out for the step (80 req/s of 2000 tokens is several replicas)
    assert replicas[-1] < max(replicas)  # and back in once it passed
    assert ours.store.drops == dict.fromkeys(ours.store.drops, 0)


def test_oracle_uses_fewer_replicas_in_quiet_windows() -> None:
    timer = ProfileFitTimer.from_dir()
    fleet_cfg = FleetConfig(engine=EngineConfig(ttft_overhead_s=timer.ttft_overhead_s))
    sla = SlaConfig()
    trace = synthetic_trace(rate_per_s=[(60.0, 2.0), (60.0, 100.0), (60.0, 2.0)], isl=2000, osl=20, seed=6)
    feasible = feasible_mask(trace, timer, fleet_cfg, sla)
    oracle, outcomes = run_oracle(trace, fleet_config=fleet_cfg, timer=timer, sla=sla, feasible=feasible)
    assert oracle.replicas[0] == 1
    assert oracle.replicas[1] > 2
    assert oracle.replicas[2] == 1
    assert np.isfinite(outcomes.ttft_s).all()


def test_disaggregated_replay_runs_every_policy_on_prefill_and_decode(tmp_path: Path) -> None:
    trace = synthetic_trace(rate_per_s=[(20.0, 5.0), (40.0, 20.0)], isl=1000, osl=30, seed=7)
    csv = tmp_path / "trace.csv"
    write_azure(csv, trace.arrival_s, 1000, 30)
    out = tmp_path / "out.json"
    code = main(
        ["replay", "--trace", str(csv), "--disaggregated", "--json", str(out), "--cold-start-s", "20", "--quiet"]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"ours", "fixed", "hpa", "dynamo", "oracle"}
    assert doc["settings"]["fleet"]["disaggregated"] is True
    assert doc["policies"]["ours"]["unfinished_requests"] == 0
    # the planner decided for both roles every tick
    modes = doc["details"]["ours"]["modes"]
    ticks = sum(modes.values())
    assert ticks % 2 == 0 and ticks >= 2 * len(doc["timelines"]["ours"])
