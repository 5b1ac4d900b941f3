"""The decision-core configs the replays in docs/benchmarks.md run with load and validate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.core import load_config
from planner.core.decision import Mode
from planner.discovery import Role

CONFIGS = Path(__file__).parents[2] / "planner" / "sim" / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_replay_config_loads(name: str) -> None:
    config = load_config(yaml.safe_load((CONFIGS / name).read_text()))
    assert config.role(Role.AGG).sla.ttft_ms == 2000 and config.role(Role.AGG).sla.itl_ms == 50


def test_ours_replay_runs_sla_mode_with_an_itl_margin() -> None:
    role = load_config(yaml.safe_load((CONFIGS / "ours_replay.yaml").read_text())).role(Role.AGG)
    assert role.mode is Mode.SLA
    assert role.itl_headroom_frac is not None and role.itl_headroom_frac > role.headroom_frac
