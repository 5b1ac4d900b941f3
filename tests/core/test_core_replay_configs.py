"""The decision-core configs the replays in docs/benchmarks.md run with load and validate."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from planner.core import RoleConfig, SlaTargets, load_config
from planner.core.decision import Mode
from planner.discovery import Role

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
