"""``fpm-planner bench soak``, tiny: every message the subscriber received is accounted for (issue 12)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main


def test_a_tiny_soak_accounts_for_every_message(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "soak", "--publishers", "2", "--hz", "20", "--seconds", "3", "--kill-every-s", "1", "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert figures["received"] == figures["accepted"] + figures["dropped"] > 0
    assert figures["dropped"] == sum(n for reason, n in figures["dropped_by_reason"].items() if reason != "oversized")
    assert figures["loop_errors"] == 0 and figures["accounting_ok"] is True
    # Every kind of fault was exercised, and every kill was seen as a restart, never as loss of 2^64 samples.
    assert figures["kills"] >= 2 and figures["restarts_seen"] >= 1
    assert {"bad_frame", "decode_error", "invalid_value"} <= set(figures["dropped_by_reason"])
    assert figures["garbage_connections"] >= 1 and figures["healthz_probes"] > 0
    assert figures["lost_samples"] < 10_000
