"""The decision-core configs the replays in docs/benchmarks.md run with load and validate."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from planner.core import RoleConfig, SlaTargets, load_config
from planner.core.decision import Mode
from planner.discovery import Role
from planner.sim.compare import CompareSettings, ours_core_config
from planner.sim.fleet_config import FleetConfig
from planner.sim.metrics import SlaConfig

CONFIGS = Path(__file__).parents[2] / "planner" / "sim" / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_replay_config_loads(name: str) -> None:
    config = load_config(yaml.safe_load((CONFIGS / name).read_text()))
    assert config.role(Role.AGG).sla.ttft_ms == 2000 and config.role(Role.AGG).sla.itl_ms == 50


def test_ours_replay_is_the_shipped_default() -> None:
    """One shipped default (issue 13 item 6): the replay's "ours" file states only the SLA and the replica bound the
    replay's flags give; every other setting is the core's default, which the service and the demo run too."""
    role = load_config(yaml.safe_load((CONFIGS / "ours_replay.yaml").read_text())).role(Role.AGG)
    shipped = msgspec.structs.replace(RoleConfig(), sla=SlaTargets(ttft_ms=2000, itl_ms=50), max_replicas=64)
    assert role == shipped
    assert role.mode in (Mode.AUTO, Mode.SLA)


def test_a_file_naming_only_agg_gives_a_disaggregated_fleet_the_replays_sla() -> None:
    """ours_replay.yaml names only ``agg``: on a disaggregated replay, prefill and decode run with the replay's SLA
    (TTFT 2000 ms) and bound, as without a file, not SlaTargets' 500 ms default (prefill sized for a 4x tighter
    TTFT than the one scored)."""
    settings = CompareSettings(
        fleet=FleetConfig(disaggregated=True),
        sla=SlaConfig(ttft_ms=2000.0, itl_ms=50.0),
        max_replicas=48,
        core_config_path=str(CONFIGS / "ours_replay.yaml"),
    )
    config = ours_core_config(settings)
    for role in (Role.PREFILL, Role.DECODE):
        assert config.role(role).sla.ttft_ms == 2000 and config.role(role).sla.itl_ms == 50
        assert config.role(role).max_replicas == 48
    assert config.role(Role.AGG) == load_config(yaml.safe_load((CONFIGS / "ours_replay.yaml").read_text())).role(
        Role.AGG
    )
