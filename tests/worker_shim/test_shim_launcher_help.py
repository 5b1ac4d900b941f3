"""``fpm-worker --help`` prints the launcher's own flags at once, without importing vLLM, and points to
``--help=vllm`` for the engine's; ``fpm-planner --version`` prints the installed version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

PROBE = """
import sys
from worker_shim.launcher import main
code = main(sys.argv[1:])
print("EXIT", code, "VLLM_IMPORTED", "vllm" in sys.modules, "TORCH_IMPORTED", "torch" in sys.modules)
"""


def run_probe(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_the_launcher_flags_without_importing_vllm() -> None:
    out = run_probe("--help")
    assert out.startswith("usage: fpm-worker")
    for flag in ("--worker-id", "--register-url", "--register-file", "--restore", "--lease-ttl-s", "--help=vllm"):
        assert flag in out
    assert "EXIT 0 VLLM_IMPORTED False TORCH_IMPORTED False" in out
    assert len(out.splitlines()) < 60


def test_help_wins_over_missing_required_flags() -> None:
    out = run_probe("--model", "m", "-h")  # no --worker-id: still the help, exit 0
    assert "usage: fpm-worker" in out and "EXIT 0" in out


def test_a_missing_worker_id_names_the_help() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--model", "m"], capture_output=True, text=True, timeout=120, check=False
    )
    assert "EXIT 2 VLLM_IMPORTED False" in done.stdout
    assert "--worker-id" in done.stderr and "fpm-worker --help" in done.stderr


def test_fpm_planner_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fpm-planner {version('fpm-planner')}"
