"""The paced ingest benchmark runs the real subscriber thread against paced publishers in child processes and
accounts for every sample (figures are printed by the bench, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from planner.bench.ingest_paced import _sample, burst_sizes, measure_paced, patchable
from planner.cli import main
from worker_shim import fpm


def test_every_paced_sample_is_stored_and_the_figures_are_all_there() -> None:
    figures = measure_paced(16, 20.0, 1.0, dp=8, publisher_procs=2, window=8, tick_interval_s=0.25)
    assert figures["mode"] == "paced" and figures["publisher_procs"] == 2 and figures["workers"] == 2
    # one step per endpoint per period (fewer only when the publishers fall behind on a busy machine)
    assert 0 < figures["sent"] <= 16 * 20
    assert figures["stored"] == figures["sent"] and figures["lost"] == 0
    assert figures["gaps"] == 0 and figures["drops_by_reason"] == {} and figures["loop_errors"] == 0
    assert figures["ticks"] >= 1 and figures["tick_ms_p99"] >= figures["tick_ms_p50"] > 0
    assert figures["ingest_thread_cpu_share"] >= 0 and figures["rss_mb"] > 0
    # the whole subscriber process (every thread, libzmq's I/O threads among them) includes the receive thread
    assert figures["process_cpu_share"] >= figures["ingest_thread_cpu_share"]
    assert figures["process_cpu_share"] >= figures["zmq_io_cpu_share"] >= 0
    assert figures["receive_rounds_per_s"] > 0 and figures["samples_per_round"] > 0
    assert figures["idle_receive_cpu_share"] >= 0 and figures["idle_round_cpu_ms"] >= 0


def test_bursts_send_each_endpoints_due_steps_back_to_back_and_every_one_is_stored() -> None:
    assert burst_sizes(50.0, 10.0, 0.0) == (0.02, [1] * 500)
    assert burst_sizes(50.0, 10.0, 0.1) == (0.1, [5] * 100)
    period_s, sizes = burst_sizes(50.0, 10.0, 0.05)  # 2.5 steps fall due per burst
    assert period_s == 0.05 and sum(sizes) == 500 and set(sizes) == {2, 3}
    figures = measure_paced(16, 40.0, 1.0, dp=8, window=64, tick_interval_s=0.25, send_interval_s=0.1)
    assert figures["send_interval_s"] == 0.1 and 0 < figures["sent"] <= 16 * 40
    assert figures["stored"] == figures["sent"] and figures["lost"] == 0  # seq and counter_id patched per step
    assert figures["gaps"] == 0 and figures["drops_by_reason"] == {} and figures["loop_errors"] == 0


def test_a_patched_payload_is_the_same_fpm_v1_sample_with_that_counter() -> None:
    for sample in (_sample("w7", 3, 0), fpm.heartbeat("", 0, 0), fpm.heartbeat("w%.x", 5, 9, run_id=2**63)):
        head, tail = patchable(sample)
        for counter in (0, 1, 127, 128, 2**32, 2**64 - 1):
            seq = counter.to_bytes(8, "big")
            decoded = fpm.decode(head + seq + tail)
            assert decoded == msgspec.structs.replace(sample, counter_id=counter)
            assert fpm.parse_frames([b"", seq, head + seq + tail])[1] == counter


def test_paced_mode_refuses_an_endpoint_count_that_is_not_whole_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ingest", "--endpoints", "12", "--dp", "8", "--seconds", "1"]) == 2
    assert "multiple of dp" in capsys.readouterr().err


def test_the_saturation_mode_stays_the_default_and_says_so() -> None:
    # In a child process: the saturation mode pins its process to one core.
    cmd = [sys.executable, "-m", "planner.cli", "bench", "ingest", "--publishers", "2", "--samples", "50"]
    out = subprocess.run([*cmd, "--window", "4"], capture_output=True, text=True, check=True, timeout=120).stdout
    figures = json.loads(out)
    assert figures["mode"] == "saturation" and figures["publishers"] == 2 and figures["samples_stored"] == 100
