"""``python -m planner.shard.bench nats``: the publisher's pre-encoded messages are valid FPM with each rank's
counter one step after the last, in both forms, and a tiny run over a real nats-server and two shard processes
accounts for every sample it sent; the capacity mode (``--drain``) holds the shards while the server queues a
fixed total for them, then every shard stores exactly its partition's samples (figures are printed by the bench,
never asserted here)."""

from __future__ import annotations

import json

import pytest

from planner.ingest.store import FleetStore
from planner.shard.bench import _fleet, _Messages, bench_nats, main
from planner.shard.partition import partition
from planner.transport.nats_source import NatsFpmSource


def test_pre_encoded_messages_store_every_step_of_every_rank_without_a_gap_in_both_forms() -> None:
    records = _fleet(3, 2)
    keys = [(r.service, wid, rank) for wid, r in records.items() for rank in range(r.dp_size)]
    for batch_steps, per_message in ((0, 1), (1, 2), (3, 6)):
        messages = _Messages(keys, batch_steps)
        assert messages.payloads_per_message == per_message
        store = FleetStore(ttl_s=60.0, window_size=4)
        src = NatsFpmSource(store, servers=["nats://127.0.0.1:1"], namespace="bench")  # never started
        src.set_workers(records)
        for step in range(4):
            for subj, buf, offsets in messages.items:
                if batch_steps:
                    src.ingest_batch(subj, messages.stamp(buf, offsets, step), 1.0)
                else:
                    src.ingest_message(subj, messages.stamp(buf, offsets, step), 1.0)
        snap = store.snapshot(1.0)
        steps = 4 * (batch_steps or 1)
        assert {key: (v.samples, v.gaps, v.restarts) for key, v in snap.ranks.items()} == {
            (wid, rank): (steps, 0, 0) for _, wid, rank in keys
        }
        assert sum(snap.drops.values()) == 0


def test_a_tiny_batched_run_over_nats_with_two_shards_stores_what_it_sent() -> None:
    figures = bench_nats(workers=4, dp=2, shards=2, seconds=1.0, publisher_procs=1, batch_steps=1, rate_per_s=400)
    assert figures["payloads_per_message"] == 2 and figures["sent"] > 0
    assert figures["stored"] == figures["sent"] and figures["lost"] == 0
    shards = figures["per_shard"]
    assert len(shards) == 2 and sum(s["stored"] for s in shards) == figures["sent"]
    assert all(s["batches"] > 0 and s["gaps"] == 0 for s in shards)


@pytest.mark.parametrize("batch_steps", [0, 2])
def test_drain_mode_stores_exactly_each_partitions_samples_after_holding_the_shards(
    batch_steps: int, capsys: pytest.CaptureFixture[str]
) -> None:
    workers, dp, steps = 8, 2, 8
    argv = ["nats", "--drain", "--workers", str(workers), "--dp", str(dp), "--shards", "2"]
    argv += ["--drain-steps", str(steps), "--batch-steps", str(batch_steps)]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    parts = partition(_fleet(workers, dp), ["s0", "s1"])
    want = {sid: len(parts[sid]) * dp * steps for sid in ("s0", "s1")}
    assert figures["sent"] == workers * dp * steps and figures["lost"] == 0
    assert figures["payloads_per_message"] == (2 * dp if batch_steps else 1)
    got = {s["shard"]: s for s in figures["per_shard"]}
    assert {sid: got[sid]["stored"] for sid in want} == want
    assert sum(s["stored"] for s in got.values()) == figures["stored"] == figures["sent"]
    assert figures["balance"]["samples_per_shard"] == [want["s0"], want["s1"]]
    for shard in got.values():
        assert shard["received_while_held"] == 0  # held: nothing was read before the release
        assert (shard["gaps"], shard["drops"], shard["slow_consumer_drops"], shard["reconnects"]) == (0, 0, 0, 0)


def test_the_tick_mode_prints_its_figures_for_every_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tick", "--workers", "16", "--dp", "2", "--shards", "2", "--ticks", "3"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["bench"], figures["engines"], figures["shards"], figures["ticks"]) == ("shard-tick", 32, 2, 3)
    assert figures["summary_bytes_per_tick"] > 0 and figures["tick_ms_p99"] >= figures["tick_ms_p50"] > 0
