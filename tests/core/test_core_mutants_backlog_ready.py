"""Rows for planner/core/backlog.py's ``backlog_cap`` after 787fb07 (docs/testing.md, mutation testing): with the
queue outlasting a start-up on the ready replicas, the detail names the desired count only where it, not the ready
ones plus what the arrivals need, sets the count.

The numbers of tests/core/test_core_backlog_ready.py: 6 desired prefilling 226,500 tokens/s (37,750 each), 1M
tokens queued, 150,000 tokens/s arriving, the arrivals alone needing 3, a 60 s start-up."""

from __future__ import annotations

from planner.core import Reason
from planner.core.backlog import backlog_cap


def test_ready_plus_the_arrivals_equal_to_the_desired_count_names_no_desired() -> None:
    # 3 ready of 6 prefill 113,250 tokens/s against 150,000 arriving: the queue grows on them. 3 + 3 = 6 is the
    # count itself; ", 6 desired" would say the desired count raised it.
    assert backlog_cap(
        12,
        6,
        queued_tokens=1_000_000.0,
        arrival_tokens_per_s=150_000.0,
        capacity_tokens_per_s=226_500.0,
        startup_s=60.0,
        arrivals_need=3,
        ready=3,
    ) == (
        6,
        Reason.BACKLOG_OUTLASTS_STARTUP,
        "1000000 queued prefill tokens grow on the 3 ready of 6 replicas, past a start-up (60 s); queued requests"
        " stay there: 3 + 3 for the arrivals",
    )
