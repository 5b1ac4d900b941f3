"""The decision core, scenario by scenario (issue 4, section 7, plus the safety rules of ARCHITECTURE.md).

Each row drives a real FleetStore with FPM samples on the workers' own endpoints, runs ``step`` every 5 s of a
simulated clock, applies each decision to the deployment (instantly, unless the row says otherwise) and checks
the timeline. Every row also checks the invariants: no NaN or infinity anywhere in any decision, no scale-down
without complete coverage, no scale-up stacked on an action in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from planner.core import (
    Action,
    CoreConfig,
    CoreState,
    Decision,
    Mode,
    Reason,
    WorkerStatus,
)
from planner.discovery import Role
from tests.core.analytic_perf import AnalyticPerf
from tests.core.fleetkit import Fleet, Load, hpa_config, hpa_role

TICK_S = 5.0
LOW_DECODE = Load(decode=160, kv=16_000)  # a role total that needs 1 replica (0.78 of the decode batch target)


def need_decode(n: int, dp: int = 1) -> Load:
    """A decode role total that needs ``n`` replicas of ``dp`` ranks (1 queued decode request per engine)."""
    return Load(decode=50, kv=5_000, queued_decode=n * dp)


@dataclass
class Timeline:
    ticks: list[tuple[float, dict[str, Decision]]] = field(default_factory=list)

    def decisions(self, service: str) -> list[Decision]:
        return [ds[service] for _, ds in self.ticks if service in ds]

    def at(self, t: float, service: str) -> Decision:
        for now, ds in self.ticks:
            if now == t:
                return ds[service]
        raise KeyError(t)

    def first(self, service: str, action: Action) -> Decision | None:
        return next((d for d in self.decisions(service) if d.action == action), None)

    def actions(self, service: str) -> list[tuple[float, Action, int]]:
        return [(d.at, d.action, d.final_replicas) for d in self.decisions(service) if d.action != Action.HOLD]


def settle(fleet: Fleet, decision: Decision) -> None:
    fleet.apply(decision)


@dataclass
class Scenario:
    name: str
    build: Callable[[], tuple[Fleet, CoreConfig]]
    feed: Callable[[Fleet, float], None]
    check: Callable[[Timeline], None]
    until_s: float = 600.0
    apply: Callable[[Fleet, Decision], None] = settle
    predictors: dict[Role, Any] | None = None


def run(s: Scenario) -> Timeline:
    fleet, config = s.build()
    state = CoreState()
    timeline = Timeline()
    t = 0.0
    while t <= s.until_s:
        s.feed(fleet, t)
        in_flight = {name: dep.in_flight for name, dep in fleet.deployments.items()}
        state, decisions = fleet.tick(state, t, config, predictors=s.predictors)
        timeline.ticks.append((t, decisions))
        for d in decisions.values():
            _check_invariants(d, in_flight.get(d.service, False))
            if d.action != Action.HOLD:
                s.apply(fleet, d)
        t += TICK_S
    return timeline


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    if isinstance(value, list | tuple):
        return [f for v in value for f in _floats(v)]
    return []


def _check_invariants(d: Decision, was_in_flight: bool) -> None:
    bad = [f for f in _floats(msgspec.to_builtins(d)) if not math.isfinite(f)]
    assert not bad, f"non-finite value in {d.id}: {bad}"
    encoded = msgspec.json.encode(d)
    assert msgspec.json.decode(encoded, type=Decision) == d
    if d.action == Action.SCALE_DOWN:
        assert d.coverage.complete, f"{d.id} scaled down on incomplete coverage: {d.summary}"
    if was_in_flight:
        assert d.action != Action.SCALE_UP, f"{d.id} stacked a scale-up on an action in flight"
    assert d.reasons[-1] in (Reason.SCALE_UP, Reason.SCALE_DOWN, Reason.HOLD)


# ------------------------------------------------------------------------------------------------ builders
def decode_fleet(n: int, *, dp: int = 1, **role: Any) -> Callable[[], tuple[Fleet, CoreConfig]]:
    def build() -> tuple[Fleet, CoreConfig]:
        fleet = Fleet()
        fleet.add_many(n, Role.DECODE, dp=dp)
        fleet.deploy("decode", n)
        return fleet, CoreConfig(roles={Role.DECODE: hpa_role(**role)})

    return build


def every_worker(load: Load) -> Callable[[Fleet, float], None]:
    def feed(fleet: Fleet, t: float) -> None:
        fleet.publish_all(t, load)

    return feed


# ------------------------------------------------------------------------------------------------ scenario 1
def restored_feed(fleet: Fleet, t: float) -> None:
    for wid, load in zip(list(fleet.workers), LOW_DECODE.split(len(fleet.workers)), strict=True):
        unsynced = wid in ("decode-2", "decode-3") and t < 400
        fleet.publish(wid, t, load, as_id="" if unsynced else None)


def restored_check(tl: Timeline) -> None:
    for d in tl.decisions("decode"):
        if d.at < 400:
            assert d.final_replicas == 4 and d.action == Action.HOLD
    held = tl.at(350, "decode")
    assert Reason.IDENTITY_NOT_SYNCED in held.reasons and Reason.SCALE_DOWN_BLOCKED in held.reasons
    assert held.coverage.identity_not_synced == 2 and not held.coverage.complete
    named = {p.worker_id: p for p in held.coverage.problems}
    assert named["decode-2"].status == WorkerStatus.IDENTITY_NOT_SYNCED
    assert named["decode-3"].status == WorkerStatus.IDENTITY_NOT_SYNCED
    assert named["decode-2"].published_as == ("",)
    assert "decode-2" in held.summary and "decode-3" in held.summary and "identity_not_synced" in held.summary
    # Synced at 400: coverage complete from then; the scale-down follows one full window later.
    down = tl.first("decode", Action.SCALE_DOWN)
    assert down is not None and down.at == 700 and down.final_replicas == 1
    assert tl.at(695, "decode").action == Action.HOLD
    assert Reason.COVERAGE_NOT_SUSTAINED in tl.at(695, "decode").reasons


# ------------------------------------------------------------------------------------------------ scenario 2
def rank_missing_feed(load: Load) -> Callable[[Fleet, float], None]:
    def feed(fleet: Fleet, t: float) -> None:
        for wid in fleet.workers:
            ranks = [r for r in range(8) if r != 5] if wid == "decode-1" else None
            fleet.publish(wid, t, load, ranks=ranks)

    return feed


def rank_missing_holds(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    d = tl.at(600, "decode")
    assert d.recommended_replicas < 3 and d.final_replicas == 3
    assert Reason.RANKS_MISSING in d.reasons
    problem = next(p for p in d.coverage.problems if p.worker_id == "decode-1")
    assert problem.status == WorkerStatus.PARTIAL and problem.missing_ranks == (5,)
    assert d.coverage.ranks_expected == 24 and d.coverage.ranks_fresh == 23
    assert "decode-1 (ranks 5)" in d.summary


def rank_missing_scales_up(tl: Timeline) -> None:
    first = tl.decisions("decode")[0]
    assert first.action == Action.SCALE_UP and first.final_replicas > 3
    assert Reason.SILENT_COUNTED_IDLE in first.reasons


# ------------------------------------------------------------------------------------------------ scenario 3
def stray_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, LOW_DECODE)
    fleet.stray("tcp://10.9.9.9:20380", "intruder", t)


def stray_check(tl: Timeline) -> None:
    down = tl.first("decode", Action.SCALE_DOWN)
    assert down is not None and down.at == 300 and down.final_replicas == 1
    assert down.coverage.complete and down.coverage.unknown_worker_drops >= 60
    decisions = tl.decisions("decode")
    assert decisions and all(Reason.UNKNOWN_WORKER_SAMPLES in d.reasons for d in decisions)


def foreign_on_known_endpoint_feed(fleet: Fleet, t: float) -> None:
    for wid, load in zip(list(fleet.workers), LOW_DECODE.split(len(fleet.workers)), strict=True):
        fleet.publish(wid, t, load, as_id="intruder" if wid == "decode-0" else None)


def foreign_on_known_endpoint_check(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    d = tl.at(600, "decode")
    problem = d.coverage.problems[0]
    assert problem.worker_id == "decode-0" and problem.published_as == ("intruder",)
    assert Reason.IDENTITY_NOT_SYNCED in d.reasons


# ------------------------------------------------------------------------------------------------ scenario 4
def pending_build(load_replicas: int) -> Callable[[], tuple[Fleet, CoreConfig]]:
    def build() -> tuple[Fleet, CoreConfig]:
        fleet = Fleet()
        fleet.add_many(3, Role.DECODE)
        fleet.deploy("decode", 4, ready=3)  # the fourth pod never schedules
        return fleet, hpa_config()

    return build


def pending_apply(fleet: Fleet, d: Decision) -> None:
    fleet.deploy(d.service, d.final_replicas, ready=min(d.final_replicas, 3))


def pending_lowered(tl: Timeline) -> None:
    before = [d for d in tl.decisions("decode") if d.at < 300]
    assert before and all(d.final_replicas == 4 for d in before)
    lowered = tl.first("decode", Action.SCALE_DOWN)
    assert lowered is not None and lowered.at == 300 and lowered.final_replicas == 3
    assert Reason.PENDING_TARGET_LOWERED in lowered.reasons
    assert Reason.TARGET_NOT_REACHED in lowered.reasons  # pending for 300 s (pending_timeout_s)
    assert tl.actions("decode") == [(300, Action.SCALE_DOWN, 3)]


def pending_no_stacking(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    d = tl.at(600, "decode")
    assert d.recommended_replicas > 4 and d.final_replicas == 4
    assert Reason.ACTION_IN_FLIGHT in d.reasons and Reason.TARGET_NOT_REACHED in d.reasons


# ------------------------------------------------------------------------------------------------ scenario 5
def zero_build() -> tuple[Fleet, CoreConfig]:
    fleet = Fleet()
    fleet.add_many(6, Role.AGG)
    fleet.deploy("agg", 6)
    return fleet, CoreConfig(roles={Role.AGG: hpa_role(min_replicas=2)})


def zero_check(tl: Timeline) -> None:
    d0 = tl.decisions("agg")[0]
    assert d0.recommended_replicas == 0 and Reason.NO_LOAD in d0.reasons
    assert tl.actions("agg") == [(300, Action.SCALE_DOWN, 2)]
    last = tl.decisions("agg")[-1]
    assert last.final_replicas == 2 and Reason.CLAMPED_TO_MIN in last.reasons


# ------------------------------------------------------------------------------------------------ scenario 6
def burst_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, need_decode(2) if t < 400 else need_decode(20))


def burst_check(tl: Timeline) -> None:
    actions = tl.actions("decode")
    # 2 -> 6 in one decision (HPA: max(+100%, +4) per 15 s), then 6 -> 12 once the period has passed, then 20.
    assert tl.at(400, "decode").recommended_replicas == 20
    assert Reason.SCALE_UP_RATE_LIMITED in tl.at(400, "decode").reasons
    assert actions == [(400, Action.SCALE_UP, 6), (415, Action.SCALE_UP, 12), (430, Action.SCALE_UP, 20)]


# ------------------------------------------------------------------------------------------------ scenario 7
def oscillating_feed(fleet: Fleet, t: float) -> None:
    high = int(t // TICK_S) % 2 == 0
    fleet.publish_all(t, need_decode(8) if high else LOW_DECODE)


def oscillating_check(tl: Timeline) -> None:
    actions = tl.actions("decode")
    assert actions and all(a == Action.SCALE_UP for _, a, _ in actions)
    assert actions[-1][2] == 8
    low = tl.at(605, "decode")
    assert low.recommended_replicas == 1 and low.final_replicas == 8
    assert Reason.SCALE_DOWN_STABILIZED in low.reasons


def oscillation_stops_check(tl: Timeline) -> None:
    # High/low every tick until 290 s, then low: the scale-down waits a full window after the last high.
    down = tl.first("decode", Action.SCALE_DOWN)
    assert down is not None and down.at == 590 and down.final_replicas == 1
    assert tl.at(585, "decode").final_replicas == 8
    ups = [a for a in tl.actions("decode") if a[1] == Action.SCALE_UP]
    assert ups and all(at < 300 for at, _, _ in ups)


def oscillation_stops_feed(fleet: Fleet, t: float) -> None:
    high = int(t // TICK_S) % 2 == 0 and t < 300
    fleet.publish_all(t, need_decode(8) if high else LOW_DECODE)


# ------------------------------------------------------------------------------------------------ scenario 8
def budget_build(max_total_gpus: int) -> Callable[[], tuple[Fleet, CoreConfig]]:
    def build() -> tuple[Fleet, CoreConfig]:
        fleet = Fleet()
        fleet.add_many(2, Role.PREFILL)
        fleet.add_many(4, Role.DECODE)
        fleet.deploy("prefill", 2)
        fleet.deploy("decode", 4)
        return fleet, CoreConfig(
            roles={Role.PREFILL: hpa_role(gpus_per_replica=2), Role.DECODE: hpa_role(gpus_per_replica=1)},
            max_total_gpus=max_total_gpus,
        )

    return build


def budget_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, Load(prefill=13_106), role=Role.PREFILL)  # prefill: 2 replicas at the budget target
    fleet.publish_all(t, need_decode(8), role=Role.DECODE)


def budget_exhausted(tl: Timeline) -> None:
    assert tl.actions("decode") == [] and tl.actions("prefill") == []
    d = tl.at(0, "decode")
    assert d.recommended_replicas == 8 and d.final_replicas == 4
    assert Reason.GPU_BUDGET_EXHAUSTED in d.reasons
    assert "exhausted" in d.summary


def budget_limited(tl: Timeline) -> None:
    assert tl.actions("decode") == [(0, Action.SCALE_UP, 6)]
    assert Reason.GPU_BUDGET_LIMITED in tl.at(0, "decode").reasons
    assert Reason.GPU_BUDGET_EXHAUSTED in tl.at(15, "decode").reasons


# ------------------------------------------------------------------------------------------------ scenario 9
def disagg_build() -> tuple[Fleet, CoreConfig]:
    fleet = Fleet()
    fleet.add_many(3, Role.PREFILL)
    fleet.add_many(3, Role.DECODE)
    fleet.deploy("prefill", 3)
    fleet.deploy("decode", 3)
    return fleet, hpa_config()


def disagg_prefill_silent_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, need_decode(7), role=Role.DECODE)


def disagg_prefill_silent_check(tl: Timeline) -> None:
    assert tl.actions("prefill") == []
    p = tl.at(600, "prefill")
    assert p.coverage.silent == 3 and Reason.WORKERS_SILENT in p.reasons and Reason.SCALE_DOWN_BLOCKED in p.reasons
    assert tl.actions("decode")[0] == (0, Action.SCALE_UP, 7)


def disagg_decode_silent_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, Load(), role=Role.PREFILL)


def disagg_decode_silent_check(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    assert tl.actions("prefill") == [(300, Action.SCALE_DOWN, 1)]


# ------------------------------------------------------------------------------------------------ safety
def silent_one_feed(load: Load) -> Callable[[Fleet, float], None]:
    def feed(fleet: Fleet, t: float) -> None:
        fleet.publish_all(t, load, skip=("decode-3",))

    return feed


def silent_one_scales_up(tl: Timeline) -> None:
    first = tl.decisions("decode")[0]
    # 3 reporting workers carry the 9 queued requests: 9 replicas; the silent one adds nothing.
    assert first.recommended_replicas == 9 and first.action == Action.SCALE_UP and first.final_replicas == 8
    assert Reason.SILENT_COUNTED_IDLE in first.reasons
    assert first.coverage.problems[0].worker_id == "decode-3"


def silent_one_blocks_down(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    assert Reason.WORKERS_SILENT in tl.at(600, "decode").reasons


def startup_check(tl: Timeline) -> None:
    assert [d.action for d in tl.decisions("decode") if d.at < 300] == [Action.HOLD] * 60
    assert Reason.STARTUP_WINDOW in tl.at(295, "decode").reasons
    assert tl.actions("decode") == [(300, Action.SCALE_DOWN, 1)]


def gap_feed(fleet: Fleet, t: float) -> None:
    if not 200 <= t < 230:  # 30 s without samples: stale after the 10 s TTL
        fleet.publish_all(t, LOW_DECODE)


def gap_check(tl: Timeline) -> None:
    # Coverage breaks at 210 (samples older than the TTL) and returns at 230: scale-down at 230 + 300.
    assert Reason.WORKERS_SILENT in tl.at(210, "decode").reasons
    assert Reason.COVERAGE_NOT_SUSTAINED in tl.at(525, "decode").reasons
    down = tl.first("decode", Action.SCALE_DOWN)
    assert down is not None and down.at == 530


def undiscovered_build() -> tuple[Fleet, CoreConfig]:
    fleet, config = decode_fleet(4)()
    fleet.deploy("decode", 5)  # five ready pods, discovery knows four
    return fleet, config


def undiscovered_check(tl: Timeline) -> None:
    assert tl.actions("decode") == []
    d = tl.at(600, "decode")
    assert Reason.READY_REPLICAS_UNDISCOVERED in d.reasons
    assert "reports 5 ready, discovery knows 4" in d.summary


def not_ready_build() -> tuple[Fleet, CoreConfig]:
    fleet, config = decode_fleet(4)()
    fleet.deploy("decode", 4, ready=3, not_ready=("decode-3",))
    return fleet, config


def not_ready_feed(fleet: Fleet, t: float) -> None:
    fleet.publish_all(t, LOW_DECODE, skip=("decode-3",))


def not_ready_check(tl: Timeline) -> None:
    d = tl.at(0, "decode")
    assert d.coverage.not_ready == 1 and d.coverage.silent == 0
    assert d.coverage.problems[0].status == WorkerStatus.NOT_READY
    # In flight (3 of 4 ready) with complete coverage of the ready three: the pending target comes down first.
    assert tl.actions("decode")[0] == (300, Action.SCALE_DOWN, 3)


def sla_build() -> tuple[Fleet, CoreConfig]:
    fleet, _ = decode_fleet(2)()
    return fleet, CoreConfig(roles={Role.DECODE: hpa_role(mode=Mode.SLA)})


def sla_check(tl: Timeline) -> None:
    d = tl.at(0, "decode")
    assert d.mode == Mode.SLA and Reason.SLA_NEEDS_MORE in d.reasons
    # 2 x 400 requests: ITL = 8 + 0.1 x 800 / N (+10% band) <= 50 ms -> N >= 2.1 -> 3 replicas.
    assert d.recommended_replicas == 3 and d.final_replicas == 3
    assert d.inputs.predicted_itl_ms is not None and d.inputs.predicted_itl_ms <= 50


def sla_not_ready_check(tl: Timeline) -> None:
    d = tl.at(0, "decode")
    assert d.mode == Mode.THRESHOLD and Reason.PERF_MODEL_NOT_READY in d.reasons


ROWS = [
    Scenario(
        "two snapshot-restored replicas publishing under '' hold the scale-down, named, until their ids sync",
        decode_fleet(4),
        restored_feed,
        restored_check,
        until_s=800,
    ),
    Scenario(
        "one DP rank of 8 missing blocks the scale-down and names the rank",
        decode_fleet(3, dp=8),
        rank_missing_feed(Load(decode=5, kv=500)),
        rank_missing_holds,
    ),
    Scenario(
        "one DP rank of 8 missing does not stop a scale-up",
        decode_fleet(3, dp=8),
        rank_missing_feed(Load(decode=5, kv=500, queued_decode=2)),
        rank_missing_scales_up,
        until_s=0,
    ),
    Scenario(
        "a stray unknown id is counted and ignored: the scale-down proceeds", decode_fleet(4), stray_feed, stray_check
    ),
    Scenario(
        "a foreign id on a known worker's endpoint holds the scale-down",
        decode_fleet(4),
        foreign_on_known_endpoint_feed,
        foreign_on_known_endpoint_check,
    ),
    Scenario(
        "a replica Pending forever: the target is lowered to the ready replicas",
        pending_build(3),
        every_worker(need_decode(3)),
        pending_lowered,
        apply=pending_apply,
    ),
    Scenario(
        "a replica Pending forever under more load: no stacking of scale-ups",
        pending_build(8),
        every_worker(need_decode(9)),
        pending_no_stacking,
        apply=pending_apply,
    ),
    Scenario("zero traffic goes down to min with no NaN anywhere", zero_build, every_worker(Load()), zero_check),
    Scenario(
        "a burst moves several replicas in one decision, within the HPA rate limits",
        decode_fleet(2),
        burst_feed,
        burst_check,
        until_s=450,
    ),
    Scenario(
        "oscillating load scales up once and does not flap inside the stabilization window",
        decode_fleet(4),
        oscillating_feed,
        oscillating_check,
        until_s=605,
    ),
    Scenario(
        "oscillating load that stops scales down one full window after the last high",
        decode_fleet(4),
        oscillation_stops_feed,
        oscillation_stops_check,
        until_s=650,
    ),
    Scenario(
        "GPU budget exhausted: the scale-up holds, the other role is untouched",
        budget_build(8),
        budget_feed,
        budget_exhausted,
        until_s=60,
    ),
    Scenario(
        "GPU budget nearly full: the scale-up gets what fits", budget_build(10), budget_feed, budget_limited, until_s=60
    ),
    Scenario(
        "disaggregated, prefill silent: decode still scales up, prefill holds",
        disagg_build,
        disagg_prefill_silent_feed,
        disagg_prefill_silent_check,
    ),
    Scenario(
        "disaggregated, decode silent: prefill still scales down, decode holds",
        disagg_build,
        disagg_decode_silent_feed,
        disagg_decode_silent_check,
    ),
    Scenario(
        "a single silent engine does not freeze a scale-up: it counts as idle",
        decode_fleet(4),
        silent_one_feed(need_decode(9)),
        silent_one_scales_up,
        until_s=0,
    ),
    Scenario(
        "a single silent engine blocks a scale-down",
        decode_fleet(4),
        silent_one_feed(LOW_DECODE),
        silent_one_blocks_down,
    ),
    Scenario(
        "no scale-down in the first full scale-down window after start",
        decode_fleet(4),
        every_worker(LOW_DECODE),
        startup_check,
    ),
    Scenario("a break in coverage restarts the scale-down window", decode_fleet(4), gap_feed, gap_check, until_s=700),
    Scenario(
        "a ready replica that discovery does not know blocks the scale-down",
        undiscovered_build,
        every_worker(LOW_DECODE),
        undiscovered_check,
    ),
    Scenario(
        "a worker the deployment reports not ready is not counted as silent",
        not_ready_build,
        not_ready_feed,
        not_ready_check,
        until_s=300,
    ),
    Scenario(
        "SLA mode moves straight to the fewest replicas meeting ITL",
        sla_build,
        every_worker(Load(decode=800)),
        sla_check,
        until_s=0,
        predictors={Role.DECODE: AnalyticPerf(decode_ms_per_kv_token=0.0)},
    ),
    Scenario(
        "SLA mode with a model that is not ready falls back to thresholds and says so",
        sla_build,
        every_worker(Load(decode=800)),
        sla_not_ready_check,
        until_s=0,
        predictors={Role.DECODE: AnalyticPerf(ready=False)},
    ),
]


@pytest.mark.parametrize("scenario", ROWS, ids=[row.name for row in ROWS])
def test_scenario(scenario: Scenario) -> None:
    scenario.check(run(scenario))
