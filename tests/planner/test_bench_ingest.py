"""The ingest benchmark runs end to end over real ZMQ and accounts for every sample (figures are not asserted)."""

from __future__ import annotations

from planner.bench.ingest import measure


def test_every_sample_sent_is_stored_or_counted() -> None:
    figures = measure(publishers=3, samples=200, window=16)
    assert figures["receive_path"] == "native"
    assert figures["samples_sent"] == 600
    assert figures["samples_stored"] + figures["dropped"] == 600
    assert figures["dropped"] == 0 and figures["drops_by_reason"] == {}
    assert figures["window_samples_held"] == 3 * 16  # bounded by the window, not by the run
    assert figures["samples_per_s"] > 0 and figures["peak_rss_mb"] > 0


def test_the_pyzmq_receive_path_accounts_for_every_sample_too() -> None:
    figures = measure(publishers=2, samples=100, window=8, receive_path="pyzmq")
    assert figures["receive_path"] == "pyzmq"
    assert figures["samples_stored"] == 200 and figures["dropped"] == 0
