"""The attainment a reactive policy could reach on a scenario: a fixed schedule of counts, not a product policy.

The schedule holds ``--before`` replicas, sets ``--count`` at ``--at`` seconds (e.g. the first tick after an
onset: flash_crowd 725, prompt_shift 905) with the start-up of ``--startup-mode`` (cold 60 s, restore 15 s) and,
with ``--down-at``, returns to ``--before`` then. Same engine, SLA, router and seed as the suite's aggregated
replays (docs/replay-baselines). Prints attainment, misses of feasible requests by 10 s of arrival, GPU-hours.
How it is used, and what it showed: docs/benchmarks.md ("Issue 13, the fifth round").

    .venv/bin/python scripts/reactive_bound.py flash_crowd --startup-mode restore --before 2 --count 8 --at 725
"""

from __future__ import annotations

import argparse

import numpy as np

from planner.sim.engine import EngineConfig
from planner.sim.fleet import FleetConfig, RouterKind, SimFleet, StartupMode
from planner.sim.metrics import SlaConfig
from planner.sim.policies import FixedPolicy, TickTraffic
from planner.sim.replay import feasible_mask, run_policy
from planner.sim.scenarios import scenario_trace
from planner.sim.timing import DEFAULT_PROFILE_DIR, default_timer, ttft_overhead_s


class Schedule(FixedPolicy):
    """A fixed policy whose count follows a schedule: every role at the last scheduled count at or before ``now``."""

    def __init__(self, schedule: list[tuple[float, int]], tick_s: float) -> None:
        super().__init__(schedule[0][1], name="bound", tick_s=tick_s)
        self.schedule = schedule

    def tick(self, fleet: SimFleet, now: float, traffic: TickTraffic) -> None:
        self.replicas = [count for at_s, count in self.schedule if now >= at_s - 1e-9][-1]
        super().tick(fleet, now, traffic)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario")
    ap.add_argument("--startup-mode", default="cold", choices=["cold", "restore"])
    ap.add_argument("--before", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--at", type=float, required=True, help="seconds")
    ap.add_argument("--down-at", type=float, default=None, help="seconds")
    ap.add_argument("--tick-s", type=float, default=5.0)
    args = ap.parse_args()
    timer = default_timer(str(DEFAULT_PROFILE_DIR))
    engine = EngineConfig(
        max_num_batched_tokens=2048, max_num_seqs=256, prefix_cache=True, ttft_overhead_s=ttft_overhead_s(timer)
    )
    fleet = FleetConfig(
        engine=engine,
        cold_start_s=60.0,
        restore_start_s=15.0,
        startup_mode=StartupMode(args.startup_mode),
        router=RouterKind.LEAST_TOKENS,
        disaggregated=False,
        kv_transfer_s=0.02,
    )
    sla = SlaConfig(ttft_ms=2000.0, itl_ms=50.0, attainment_target=0.99)
    trace = scenario_trace(args.scenario, seed=0)
    feasible = feasible_mask(trace, timer, fleet, sla)
    schedule = [(0.0, args.before), (args.at, args.count)]
    if args.down_at is not None:
        schedule.append((args.down_at, args.before))
    res = run_policy(
        trace,
        Schedule(schedule, args.tick_s),
        fleet_config=fleet,
        timer=timer,
        sla=sla,
        feasible=feasible,
        initial_replicas=args.before,
    )
    miss = feasible & ~res.outcomes.met(sla)
    buckets, counts = np.unique(np.floor(trace.arrival_s[miss] / 10) * 10, return_counts=True)
    print(
        f"{args.scenario} {args.startup_mode}: {args.before} -> {args.count} at {args.at:g} s: attainment "
        f"{100 * (1 - miss.sum() / feasible.sum()):.2f} %, {int(miss.sum())} misses (budget "
        f"{int(feasible.sum() * 0.01)}), {res.gpu_hours:.3f} GPU-h"
    )
    print("  misses by arrival: " + ", ".join(f"{int(b)}:{c}" for b, c in zip(buckets, counts, strict=True)))


if __name__ == "__main__":
    main()
