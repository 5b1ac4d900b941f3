"""Rows for planner/core/backlog.py's ``served_prefill_tokens_per_s`` at its small inputs (docs/testing.md, mutation
testing): the guard that returns the guess unchecked is for a prompt of no length and a guess of nothing, not for a
one-token prompt or a guess under one token a second; each of those is still checked against the latency model
and bisected to the engine's edge. Fails on the mutants named (``MUTANT_UNDER_TEST``): ``isl_tokens <= 1`` (4) and
``guess_tokens_per_s <= 1`` (8)."""

from __future__ import annotations

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE
from tests.core.test_core_mutants_backlog import resolution, saturated_at, served


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


@pytest.mark.parametrize(
    ("case", "isl", "osl", "guess"),
    [
        # mutant 4: one-token prompts at 1000 a second saturate the H200 engine (it serves ~134)
        ("one-token prompts", 1.0, 50.0, 1000.0),
        # mutant 8: outputs of a million tokens, fewer than two of which fit the KV cache, saturate the engine at
        # ~0.05 prompt tokens/s of 1000-token prompts: a guess of 1 or 0.5 token/s is too high
        ("a guess of one token a second", 1000.0, 1e6, 1.0),
        ("a guess under one token a second", 1000.0, 1e6, 0.5),
    ],
)
def test_a_small_prompt_or_guess_is_still_checked_against_the_engine(
    model: PerfModel, case: str, isl: float, osl: float, guess: float
) -> None:
    tokens_per_s = served(model, isl, osl, guess)
    assert 0.0 < tokens_per_s < guess, case
    assert not saturated_at(model, tokens_per_s, isl, osl), case
    assert saturated_at(model, tokens_per_s * 1.01 + resolution(guess), isl, osl), case
