"""FPM traffic in sharded mode, pure parts: each shard's cumulative counters in its summary, differenced by the
leader into the same windows an unsharded store fills, checked against one store fed every shard's samples."""

from __future__ import annotations

import random
import re

import msgspec
import pytest

from planner.core.observation import Traffic
from planner.discovery import Role, WorkerRecord
from planner.ingest.store import FleetStore
from planner.ingest.traffic import TrafficWindows
from planner.shard import traffic_bench
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.summary import ShardSummary, decode_summary, encode_summary, summarize
from planner.shard.traffic import CumulativeTraffic, TrafficDiffer
from worker_shim.fpm import HIST_MAX_BUCKET, ForwardPassMetrics, ScheduledRequests, StepTraffic
from worker_shim.metrics import TrafficAccumulator

OFFSET = 1_700_000_000.0  # wall clock = local (monotonic) clock + OFFSET
TARGETS = {"ttft_target_ms": 500.0, "itl_target_ms": 50.0}
COUNTS = ("requests_in_window", "ttft_samples_in_window", "itl_samples_in_window")


def fleet() -> dict[str, WorkerRecord]:
    out = {}
    for i in range(6):
        role = Role.PREFILL if i % 3 == 0 else Role.DECODE
        out[f"w{i}"] = WorkerRecord(
            worker_id=f"w{i}",
            role=role,
            service=role.value,
            dp_size=2,
            fpm_endpoints=(f"tcp://10.0.{i}.1:20380", f"tcp://10.0.{i}.1:20381"),
        )
    return out


def step_traffic(rng: random.Random) -> StepTraffic:
    acc = TrafficAccumulator()
    for _ in range(rng.randrange(0, 4)):  # some steps carry an empty extension
        acc.arrival(rng.randrange(10, 8000))
        acc.first_token(rng.lognormvariate(5.5, 1.0))
    for _ in range(rng.randrange(0, 3)):
        acc.completion(rng.randrange(1, 2000), rng.lognormvariate(3.3, 0.5))
    return acc.take()


class Shard:
    """A shard's store and traffic counters, as :class:`~planner.shard.process.IngestShard` wires them."""

    def __init__(self, shard_id: str, workers: dict[str, WorkerRecord], run_started_at: float) -> None:
        self.shard_id = shard_id
        self.store = FleetStore(ttl_s=10.0)
        self.store.set_workers(workers)
        self.traffic = CumulativeTraffic()
        self.store.traffic = self.traffic
        self.run_started_at = run_started_at
        self.seq = 0

    def summary(self, now: float) -> ShardSummary:
        self.seq += 1
        got = summarize(
            self.shard_id,
            self.seq,
            self.store.snapshot(now),
            now + OFFSET,
            received=0,
            traffic=self.traffic,
            run_started_at=self.run_started_at,
        )
        return decode_summary(encode_summary(got))  # over the wire


def feed_steps(
    workers: dict[str, WorkerRecord],
    stores: list[FleetStore],
    owner: dict[str, str],
    shards: dict[str, Shard],
    start: float,
    seconds: float,
    rng: random.Random,
) -> float:
    """Every rank steps every 0.1 s from ``start``; each sample goes to its owner's store and to ``stores``."""
    at = start
    counter = 0
    while at < start + seconds:
        counter += 1
        for wid, record in workers.items():
            for rank, endpoint in enumerate(record.fpm_endpoints):
                sample = ForwardPassMetrics(
                    worker_id=wid,
                    dp_rank=rank,
                    counter_id=counter,
                    wall_time=0.02,
                    scheduled_requests=ScheduledRequests(num_decode_requests=4),
                    traffic=step_traffic(rng),
                )
                for store in [*stores, shards[owner[wid]].store]:
                    store.ingest(endpoint, sample, at, at)
        at += 0.1
    return at


def same_window(got: Traffic | None, want: Traffic | None) -> None:
    assert got is not None and want is not None
    g, w = msgspec.structs.asdict(got), msgspec.structs.asdict(want)
    assert g.keys() == w.keys()
    for key in COUNTS:
        assert g[key] == w[key] and w[key] > 0, key
    for key, value in w.items():
        assert value is not None, key
        # the window's span goes through the wall clock (~1.7e9 s, 0.2 µs resolution): the rate within 1e-6
        rel = 1e-6 if key in ("window_s", "request_rate_per_s") else 1e-9
        assert g[key] == pytest.approx(value, rel=rel, abs=1e-12), key


def test_the_leaders_windows_from_two_shards_summaries_equal_one_store_fed_every_sample() -> None:
    rng = random.Random(7)
    workers = fleet()
    parts = partition(workers, ["s0", "s1"])
    assert parts["s0"] and parts["s1"]
    owner = {w: s for s, ws in parts.items() for w in ws}
    shards = {s: Shard(s, {w: workers[w] for w in parts[s]}, run_started_at=OFFSET + 1.0) for s in parts}
    reference = FleetStore(ttl_s=10.0)
    reference.set_workers(workers)
    one = TrafficWindows(window_s=60.0)
    reference.traffic = one

    leader = TrafficWindows(window_s=60.0)
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    merger.set_workers(workers)
    differ = TrafficDiffer(started_at=OFFSET)  # the leader was listening before the shards started

    now = feed_steps(workers, [reference], owner, shards, 10.0, 3.0, rng)
    for shard in shards.values():
        merger.update(shard.summary(now))
    assert differ.feed(leader, merger.summaries().values(), wall_now=now + OFFSET, local_now=now) == 2
    # the same summaries again add nothing
    assert differ.feed(leader, merger.summaries().values(), wall_now=now + OFFSET, local_now=now) == 0
    for service in ("prefill", "decode"):
        same_window(leader.traffic(service, now, **TARGETS), one.traffic(service, now, **TARGETS))

    # s0's next summary is lost on the way: its following one still holds those samples
    now = feed_steps(workers, [reference], owner, shards, now, 2.0, rng)
    shards["s0"].summary(now)
    merger.update(shards["s1"].summary(now))
    differ.feed(leader, merger.summaries().values(), wall_now=now + OFFSET, local_now=now)
    now = feed_steps(workers, [reference], owner, shards, now, 2.0, rng)
    for shard in shards.values():
        merger.update(shard.summary(now))
    differ.feed(leader, merger.summaries().values(), wall_now=now + OFFSET, local_now=now)
    for service in ("prefill", "decode"):
        same_window(leader.traffic(service, now, **TARGETS), one.traffic(service, now, **TARGETS))
    assert set(leader.services()) == set(one.services()) == {"prefill", "decode"}
    assert leader.samples == one.samples  # every sample that carried the extension, once
    assert differ.applied == 5 and differ.baselined == 0 and differ.resets == 0


def test_a_restarted_shard_is_counted_from_its_start_and_a_run_older_than_the_leader_is_a_baseline() -> None:
    rng = random.Random(3)
    workers = {w: r for w, r in fleet().items() if r.service == "decode"}
    owner = dict.fromkeys(workers, "s0")
    leader = TrafficWindows(window_s=60.0)
    differ = TrafficDiffer(started_at=OFFSET + 5.0)
    # s0's run started before the leader: what it counted so far is not the leader's to add
    old = {"s0": Shard("s0", workers, run_started_at=OFFSET + 1.0)}
    now = feed_steps(workers, [], owner, old, 1.0, 5.0, rng)
    differ.feed(leader, [old["s0"].summary(now)], wall_now=now + OFFSET, local_now=now)
    assert differ.baselined == 1
    empty = leader.traffic("decode", now)
    assert empty is not None and empty.requests_in_window == 0  # known, nothing counted yet
    # from then on, its samples count
    after = TrafficWindows(window_s=60.0)
    reference = FleetStore(ttl_s=10.0)
    reference.set_workers(workers)
    reference.traffic = after
    now = feed_steps(workers, [reference], owner, old, now, 2.0, rng)
    differ.feed(leader, [old["s0"].summary(now)], wall_now=now + OFFSET, local_now=now)
    got, want = leader.traffic("decode", now), after.traffic("decode", now)
    assert got is not None and want is not None
    assert got.requests_in_window == want.requests_in_window > 0
    assert got.ttft_ms_p90 == pytest.approx(want.ttft_ms_p90, rel=1e-9)

    # s0 restarts (a new run, after the leader started): counted from its start, the old run's counters never again
    new = {"s0": Shard("s0", workers, run_started_at=OFFSET + now)}
    now = feed_steps(workers, [reference], owner, new, now, 2.0, rng)
    differ.feed(leader, [new["s0"].summary(now)], wall_now=now + OFFSET, local_now=now)
    got, want = leader.traffic("decode", now), after.traffic("decode", now)
    assert got is not None and want is not None
    assert (got.requests_in_window, got.ttft_samples_in_window) == (
        want.requests_in_window,
        want.ttft_samples_in_window,
    )
    assert got.isl_tokens_p50 == pytest.approx(want.isl_tokens_p50, rel=1e-9)
    assert differ.baselined == 1 and differ.resets == 0


def test_a_version_1_summary_without_traffic_is_read_as_no_traffic_for_that_shard() -> None:
    workers = fleet()
    shard = Shard("s0", workers, run_started_at=OFFSET)
    feed_steps(workers, [], dict.fromkeys(workers, "s0"), {"s0": shard}, 0.0, 1.0, random.Random(1))
    current = msgspec.structs.asdict(shard.summary(1.0))
    assert current["traffic"]  # the shard counted traffic
    v1 = {k: v for k, v in current.items() if k not in ("run_started_at", "traffic")} | {"version": 1}
    summary = decode_summary(msgspec.msgpack.encode(v1))
    assert summary.version == 1 and summary.traffic == {} and summary.run_started_at is None
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=5.0)
    merger.set_workers(workers)
    assert merger.update(summary)
    assert merger.snapshot(1.0 + OFFSET).totals.fresh_ranks.sum() == 12  # everything else read as before
    leader = TrafficWindows(window_s=60.0)
    assert TrafficDiffer(started_at=0.0).feed(leader, [summary], wall_now=1.0 + OFFSET, local_now=1.0) == 0
    assert leader.services() == () and leader.traffic("decode", 1.0) is None


def test_a_summary_with_traffic_no_shard_can_send_is_refused_naming_it() -> None:
    workers = fleet()
    shard = Shard("s0", workers, run_started_at=OFFSET)
    feed_steps(workers, [], dict.fromkeys(workers, "s0"), {"s0": shard}, 0.0, 1.0, random.Random(2))
    good = msgspec.structs.asdict(shard.summary(1.0))
    with pytest.raises(ValueError, match="version 3"):
        decode_summary(msgspec.msgpack.encode(good | {"version": 3}))
    bad = msgspec.msgpack.decode(msgspec.msgpack.encode(good))
    bad["traffic"]["decode"][2][2] = {9999: 1}  # arrivals: a bucket past the last one
    with pytest.raises(ValueError, match=r"'decode'.*arrivals"):
        decode_summary(msgspec.msgpack.encode(bad))
    bad["traffic"]["decode"][2] = [-1, 0.0, {}]  # a negative count
    with pytest.raises(ValueError, match="not a shard summary"):
        decode_summary(msgspec.msgpack.encode(bad))


def test_the_traffic_bench_prints_the_summary_size_and_cpu_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert traffic_bench.main(["--samples", "3000", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    typical = re.search(r"after 3000 samples: buckets \[(\d+), (\d+), (\d+), (\d+)\], (\d+) bytes", out)
    worst = re.search(r"worst case \(every bucket of every histogram\): (\d+) bytes", out)
    assert typical is not None and worst is not None, out
    buckets = [int(b) for b in typical.groups()[:4]]
    assert len(buckets) == 4 and all(0 < b <= HIST_MAX_BUCKET + 1 for b in buckets)
    assert 0 < int(typical.group(5)) < int(worst.group(1))
    assert re.search(r"shard CPU per sample: empty extension [\d.]+ us, lognormal mix [\d.]+ us", out), out
    assert re.search(r"leader CPU to difference 2 shards x 2 services: [\d.]+ ms", out), out
