"""The backlog-aware cap of a scale-up (planner.core.backlog), row by row: when it binds, the count, the reason and
the detail an operator reads; and the prompt tokens one aggregated engine serves (the measured H200 profile),
against the latency model it is the edge of. Written for the mutants docs/mutation-results.md listed as
surviving in backlog.py."""

from __future__ import annotations

import math

import pytest

from perf_model.model import PerfModel
from perf_model.step_timer import ProfileStepTimer
from planner.core.agg_latency import predict_agg_latency
from planner.core.backlog import backlog_cap, served_prefill_tokens_per_s
from planner.core.decision import Reason
from planner.discovery import Role
from tests.core.fleetkit import H200_PROFILE

# 4 replicas serving 3000 prompt tokens/s each over 1000 arriving: a surplus of 2000 tokens/s; a 60 s start-up;
# the search asked for 8 replicas and the arrivals alone need 3.
BASE: dict[str, float | int | None] = {
    "queued_tokens": 20_000.0,
    "arrival_tokens_per_s": 1000.0,
    "capacity_tokens_per_s": 3000.0,
    "startup_s": 60.0,
    "arrivals_need": 3,
}


def cap(searched: int | None = 8, current: int = 4, **over: float | int | None) -> tuple[int, Reason, str] | None:
    return backlog_cap(searched, current, **{**BASE, **over})  # type: ignore[arg-type]


def test_a_backlog_that_drains_before_a_start_up_keeps_the_current_count() -> None:
    assert cap() == (
        4,
        Reason.BACKLOG_DRAINS_BEFORE_STARTUP,
        "20000 queued prefill tokens drain in 10 s on 4 replicas, before a start-up (60 s): 4 for the arrivals",
    )
    # draining in exactly one start-up still counts as before it
    assert cap(queued_tokens=120_000.0) == (
        4,
        Reason.BACKLOG_DRAINS_BEFORE_STARTUP,
        "120000 queued prefill tokens drain in 60 s on 4 replicas, before a start-up (60 s): 4 for the arrivals",
    )
    # no search answer: the cap is the answer
    assert cap(searched=None) == cap()


def test_a_backlog_that_outlasts_a_start_up_adds_what_the_arrivals_need() -> None:
    assert cap(queued_tokens=100.0, capacity_tokens_per_s=1000.5, startup_s=60.0) == (
        7,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "100 queued prefill tokens drain in 200 s on 4 replicas, past a start-up (60 s); queued requests stay there:"
        " 4 + 3 for the arrivals",
    )


def test_a_backlog_that_no_surplus_drains_grows() -> None:
    assert cap(arrival_tokens_per_s=1.0, capacity_tokens_per_s=1.0) == (
        7,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "20000 queued prefill tokens grow on 4 replicas, past a start-up (60 s); queued requests stay there:"
        " 4 + 3 for the arrivals",
    )


def test_the_cap_binds_down_to_the_smallest_positive_inputs() -> None:
    assert cap(current=1) == (
        3,
        Reason.BACKLOG_DRAINS_BEFORE_STARTUP,
        "20000 queued prefill tokens drain in 10 s on 1 replicas, before a start-up (60 s): 3 for the arrivals",
    )
    assert cap(queued_tokens=1.0) is not None
    assert cap(arrival_tokens_per_s=1.0) is not None
    assert cap(startup_s=1.0, queued_tokens=1000.0) is not None


@pytest.mark.parametrize(
    ("case", "searched", "current", "over"),
    [
        ("no scale-up asked", 4, 4, {}),
        ("the cap is no lower than the search's answer", 4, 3, {"arrivals_need": 4}),
        ("no replica to hold a queue", 8, 0, {}),
        ("no queue", 8, 4, {"queued_tokens": 0.0}),
        ("no arrivals", 8, 4, {"arrival_tokens_per_s": 0.0}),
        ("no start-up delay", 8, 4, {"startup_s": 0.0}),
        ("no capacity", 8, 4, {"capacity_tokens_per_s": 0.0}),
        ("an unknown capacity", 8, 4, {"capacity_tokens_per_s": math.inf}),
        ("the arrivals alone cannot be served", 8, 4, {"arrivals_need": None}),
        ("the outlasting cap would not be lower", 7, 4, {"queued_tokens": 1e9}),
    ],
)
def test_the_cap_does_not_bind(case: str, searched: int, current: int, over: dict[str, float | None]) -> None:
    assert cap(searched, current, **over) is None, case


# --- served_prefill_tokens_per_s ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> PerfModel:
    return PerfModel(Role.AGG, bootstrap=ProfileStepTimer.from_dir(H200_PROFILE))


ENGINE = {"max_num_batched_tokens": 2048, "max_num_seqs": 256.0, "kv_capacity_tokens": 945_029.0}


def saturated_at(model: PerfModel, tokens_per_s: float, isl: float, osl: float, **over: float) -> bool:
    agg = predict_agg_latency(
        model,
        rate_per_s=tokens_per_s / isl,
        isl_tokens=isl,
        osl_tokens=osl,
        kv_per_request_tokens=isl + osl / 2.0,
        **{**ENGINE, **over},  # type: ignore[arg-type]
    )
    return bool(agg.saturated)


def served(model: PerfModel, isl: float, osl: float, guess: float, **over: float) -> float:
    return served_prefill_tokens_per_s(
        model,
        isl_tokens=isl,
        osl_tokens=osl,
        kv_per_request_tokens=isl + osl / 2.0,
        decode_requests=0.0,
        guess_tokens_per_s=guess,
        **{**ENGINE, **over},  # type: ignore[arg-type]
    )


def resolution(guess: float) -> float:
    """The bisection's resolution in prompt tokens/s: 12 halvings of [0, 2 x guess]."""
    return 2.0 * guess / 2**12


@pytest.mark.parametrize(
    ("case", "isl", "osl", "guess", "over"),
    [
        ("long prompts, under one prompt a second", 30_000.0, 50.0, 40_000.0, {}),
        ("long outputs: the sequence limit binds", 1000.0, 2000.0, 2000.0, {"max_num_seqs": 16.0}),
        ("long outputs: the KV capacity binds", 1000.0, 2000.0, 2000.0, {"kv_capacity_tokens": 40_000.0}),
    ],
)
def test_an_engine_serves_the_highest_prompt_rate_it_is_not_saturated_at(
    model: PerfModel, case: str, isl: float, osl: float, guess: float, over: dict[str, float]
) -> None:
    tokens_per_s = served(model, isl, osl, guess, **over)
    assert 0.0 < tokens_per_s < guess, case
    assert not saturated_at(model, tokens_per_s, isl, osl, **over), case
    assert saturated_at(model, tokens_per_s * 1.01 + resolution(guess), isl, osl, **over), case


def test_a_guess_the_engine_serves_twice_over_stands(model: PerfModel) -> None:
    isl, osl, wide = 2000.0, 100.0, 200_000.0
    edge = served(model, isl, osl, wide)
    guess = edge * 0.45  # twice it is still served
    assert served(model, isl, osl, guess) == guess
    # a guess whose double saturates the engine is bisected to the same edge
    closer = edge * 0.6
    assert served(model, isl, osl, closer) == pytest.approx(edge, abs=resolution(wide) + resolution(closer))


def test_without_a_prompt_length_or_a_usable_guess_the_guess_stands(model: PerfModel) -> None:
    assert served(model, 0.0, 100.0, 5000.0) == 5000.0
    assert served(model, 2000.0, 100.0, math.inf) == math.inf
    assert served(model, 2000.0, 100.0, 0.0) == 0.0
