"""scripts/suite.py: which core config "ours" runs with on a baseline scored at another SLA than the one the
config file states (the held-out suite's other-SLA runs, docs/replay-heldout/)."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = "planner/sim/configs/ours_replay.yaml"


def _suite() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_script", ROOT / "scripts" / "suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["suite_script"] = module
    spec.loader.exec_module(module)
    return module


def _baseline(ttft_ms: float, itl_ms: float, *, disaggregated: bool) -> dict[str, Any]:
    flags = f"--scenario flash_crowd --ttft-ms {ttft_ms:g} --itl-ms {itl_ms:g}"
    flags += " --disaggregated" if disaggregated else ""
    return {
        "command": f"fpm-planner replay {flags} --policy fixed,hpa,dynamo,oracle --quiet --json x.json",
        "settings": {"sla": {"ttft_ms": ttft_ms, "itl_ms": itl_ms}, "fleet": {"disaggregated": disaggregated}},
    }


def _ours_words(baseline: dict[str, Any], core_config: str | None) -> list[str]:
    suite = _suite()
    return list(
        suite._ours_command(
            baseline, Path("b.json"), Path("o.json"), suite._core_config_for(baseline, core_config, str(ROOT))
        )
    )


def test_an_aggregated_run_at_another_sla_runs_ours_without_the_shipped_file() -> None:
    """ours_replay.yaml states agg 2000 / 50 ms: an aggregated run scored at 1000 / 35 ms must not make ours aim
    at 2000 / 50 ms, so the file is left out (the replay then gives the role the run's SLA)."""
    words = _ours_words(_baseline(1000.0, 35.0, disaggregated=False), SHIPPED)
    assert "--core-config" not in words
    assert words[words.index("--ttft-ms") + 1] == "1000"
    assert words[words.index("--itl-ms") + 1] == "35"


def test_a_run_at_the_files_sla_keeps_the_file() -> None:
    words = _ours_words(_baseline(2000.0, 50.0, disaggregated=False), SHIPPED)
    assert words[words.index("--core-config") + 1] == SHIPPED


def test_a_disaggregated_run_keeps_the_file_that_names_only_agg() -> None:
    """The file does not name prefill / decode, so the replay already gives them the run's SLA."""
    words = _ours_words(_baseline(1000.0, 35.0, disaggregated=True), SHIPPED)
    assert words[words.index("--core-config") + 1] == SHIPPED
    assert "--policy" in words and words[words.index("--policy") + 1] == "ours"


def test_the_ours_command_carries_the_baselines_flags() -> None:
    baseline = _baseline(2000.0, 50.0, disaggregated=True)
    words = _ours_words(baseline, None)
    assert "--core-config" not in words
    kept = shlex.split(baseline["command"])[2:6]
    assert words[4 : 4 + len(kept)] == kept
