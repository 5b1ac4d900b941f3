"""Observation rows the mutation run showed missing: a deployment status built from what an actuator reads, and
when an earlier action counts as in flight."""

from __future__ import annotations

import math

import pytest

from planner.actuators.base import ServiceStatus
from planner.core import DeploymentStatus, Traffic
from planner.core.observation import MAX_PLAUSIBLE_RATE_PER_S, MAX_PLAUSIBLE_TOKENS


def test_a_deployment_status_carries_every_count_the_actuator_read() -> None:
    read = ServiceStatus(service="decode", desired=6, ready=4, available=3, updated=5, observed_at=12.0, state="x")
    assert DeploymentStatus.from_service_status(read) == DeploymentStatus(
        service="decode", desired=6, ready=4, available=3, updated=5
    )
    flagged = DeploymentStatus.from_service_status(read, action_in_flight=True, not_ready_workers=("decode-3",))
    assert (flagged.action_in_flight, flagged.not_ready_workers) == (True, ("decode-3",))


@pytest.mark.parametrize(
    ("desired", "ready", "flagged", "in_flight"),
    [(4, 4, False, False), (4, 3, False, True), (4, 5, False, False), (4, 4, True, True)],
    ids=["settled", "fewer ready than desired", "more ready than desired (scale-down settling)", "flagged"],
)
def test_in_flight(desired: int, ready: int, flagged: bool, in_flight: bool) -> None:
    status = DeploymentStatus(service="s", desired=desired, ready=ready, action_in_flight=flagged)
    assert status.in_flight is in_flight


TOKENS = ("isl_tokens", "osl_tokens", *tuple(f"{k}_tokens_p{q}" for k in ("isl", "osl") for q in (50, 90, 99)))
LATENCIES = (*tuple(f"{k}_ms_p{q}" for k in ("ttft", "itl") for q in (50, 90, 99)), "window_s")
FRACTIONS = ("ttft_attainment_frac", "itl_attainment_frac")
COUNTS = ("ttft_samples_in_window", "itl_samples_in_window", "requests_in_window")


def test_traffic_clean_keeps_every_plausible_figure() -> None:
    """Every field at a distinct plausible value, edges included (0, the token and rate limits, fractions 0 and 1)."""
    values: dict[str, object] = {"request_rate_per_s": MAX_PLAUSIBLE_RATE_PER_S}
    values |= {name: float(i + 1) for i, name in enumerate(TOKENS)}
    values["isl_tokens_p99"] = MAX_PLAUSIBLE_TOKENS
    values |= {name: 1000.0 + i for i, name in enumerate(LATENCIES)}
    values["ttft_ms_p50"] = 0.0
    values |= {"ttft_attainment_frac": 0.0, "itl_attainment_frac": 1.0}
    values |= {name: i for i, name in enumerate(COUNTS)}
    traffic = Traffic(**values)  # type: ignore[arg-type]
    assert traffic.clean() == traffic


def test_traffic_clean_drops_every_implausible_figure() -> None:
    bad: dict[str, object] = {"request_rate_per_s": MAX_PLAUSIBLE_RATE_PER_S * 2}
    bad |= {name: MAX_PLAUSIBLE_TOKENS * 2 for name in TOKENS}
    bad |= {name: math.inf for name in LATENCIES}
    bad |= {"ttft_attainment_frac": 1.5, "itl_attainment_frac": -0.1}
    bad |= {name: -1 for name in COUNTS}
    assert Traffic(**bad).clean() == Traffic()  # type: ignore[arg-type]
    nans: dict[str, object] = {name: math.nan for name in ("request_rate_per_s", *TOKENS, *LATENCIES, *FRACTIONS)}
    assert Traffic(**nans).clean() == Traffic()  # type: ignore[arg-type]
    negative: dict[str, object] = {name: -1.0 for name in ("request_rate_per_s", *TOKENS, *LATENCIES)}
    assert Traffic(**negative, requests_in_window=True).clean() == Traffic()  # type: ignore[arg-type]
