"""What the sharded service learns beyond the summaries' totals, through the real setup of
``test_service_sharded`` (a planner served by uvicorn over HTTP, a real nats-server, shim publishers with their
relays, a ``python -m planner.shard`` process following the leader):

- the shard checks samples against the planner's ``ingest.limits`` (sent in the membership), not the defaults;
- ``/v1/diagnostics`` shows each rank's sample counters and ages as the shard counted them, not zeros;
- the perf model is fed the shard's training points (``fpm-shard.<ns>.perf.v1.<shard>``), and the leader refuses
  points of workers outside its membership;
- the fleet-wide points rate is ``ingest.shards.perf_points_per_s`` (validated) and reaches the membership the
  shards follow; with ``perf_model.enabled: false`` the leader announces rate 0 and the shard sends no point."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import yaml

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import ReplicaBounds
from planner.errors import ConfigError
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.service.sharded_ingest import ShardedIngest
from planner.shard.perf_points import DEFAULT_PERF_POINTS_PER_S, PerfPoint, encode_perf_points, perf_points_subject
from planner.shard.process import MembershipFollower, summary_subject
from planner.shard.summary import decode_summary
from tests.planner.nats_support import NatsServer
from tests.planner.test_shard_merge import fleet as worker_records
from tests.service.support import TOKEN, serve_runner, stop_process, wait_for
from tests.service.test_service_sharded import (
    DECODE,
    DP,
    NS,
    RANKS,
    Fleet,
    _diagnostics,
    _shard_process,
    server,
)
from worker_shim.fpm import ScheduledRequests

__all__ = ["server"]  # the nats-server fixture

MAX_REQUESTS = 5  # the planner's limit: w3's ranks publish 6 decode requests a step, beyond it


def _runner(
    tmp_path: Path,
    server: NatsServer,
    fleet: Fleet | None,
    *,
    limits: bool = True,
    shards: dict[str, Any] | None = None,
    perf_model: dict[str, Any] | None = None,
) -> PlannerRunner:
    """The planner of ``fleet`` (None: no static workers) on ``server``, sharded; ``limits``: MAX_REQUESTS;
    ``shards``/``perf_model``: settings added to those sections."""
    document: dict[str, Any] = {"tick_interval_s": 0.2}
    if fleet is not None:
        workers = tmp_path / "workers.yaml"
        workers.write_text(yaml.safe_dump(fleet.workers_yaml()))
        document["discovery"] = {"static_file": str(workers)}
    (tmp_path / "nats-password").write_text("pp\n")
    config = tmp_path / "planner.yaml"
    nats_settings = {
        "servers": [server.url],
        "namespace": NS,
        "user": "planner",
        "password_file": str(tmp_path / "nats-password"),
    }
    document["ingest"] = {
        "transport": "nats",
        "nats": nats_settings,
        "shards": {"enabled": True, "max_summary_age_s": 1.5, **(shards or {})},
        **({"limits": {"max_requests": MAX_REQUESTS}} if limits else {}),
    }
    if perf_model is not None:
        document["perf_model"] = perf_model
    config.write_text(yaml.safe_dump(document))
    actuator = AdvisoryActuator({"decode": ReplicaBounds(min_replicas=1, max_replicas=8)}, replicas={"decode": 4})
    return PlannerRunner(load_config(config, {"FPM_PLANNER_TOKEN": TOKEN}), actuator=actuator)


async def _publish_as_shard(server: NatsServer, subject: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(servers=[server.url], user="s0", password="ps")
    try:
        for payload in payloads:
            await nc.publish(subject, payload)
        await nc.flush()
    finally:
        await nc.close()


def _ranks(document: dict[str, Any], worker_id: str) -> list[dict[str, Any]]:
    ranks: list[dict[str, Any]] = next(w["ranks"] for w in document["workers"] if w["worker_id"] == worker_id)
    return ranks


def test_the_sharded_service_applies_its_limits_shows_rank_counters_and_feeds_the_perf_model(
    server: NatsServer, tmp_path: Path
) -> None:
    assert DECODE["w3"] > MAX_REQUESTS >= max(DECODE[w] for w in DP if w != "w3")
    fleet = Fleet(server)
    runner = _runner(tmp_path, server, fleet)
    assert isinstance(runner.ingest, ShardedIngest)
    proc = _shard_process(server, "s0")
    try:
        with serve_runner(runner) as served:

            def settled() -> dict[str, Any] | None:
                document = _diagnostics(served)
                ranks = [r for w in document["workers"] if w["worker_id"] != "w3" for r in w["ranks"]]
                heard = len(ranks) == RANKS - DP["w3"] and all(r["fresh"] and r["samples"] > 0 for r in ranks)
                accepted = document["perf_model"]["roles"]["decode"]["accepted"] > 0
                return document if heard and accepted and document["drops"]["invalid_value"] > 0 else None

            document = wait_for(settled, timeout_s=60)
            # the planner's limit, applied by the shard: every step of w3 is beyond it, dropped as invalid_value
            w3 = next(w for w in document["workers"] if w["worker_id"] == "w3")
            assert w3["drops"]["invalid_value"] > 0
            w3_ranks = _ranks(document, "w3")
            assert len(w3_ranks) > 0 and [r for r in w3_ranks if r["samples"] != 0 or r["fresh"]] == []  # none stored
            # every other rank: the counters the shard keeps, not zeros
            for wid in ("w0", "w1", "w2"):
                for rank in _ranks(document, wid):
                    assert rank["samples"] > 0 and rank["counter_gaps"] == 0
                    assert rank["last_sample_age_s"] is not None and rank["last_sample_age_s"] < 10
                    assert rank["last_active_age_s"] is not None and rank["last_active_age_s"] < 10
            # the perf model learned from the shard's points (w3's were never stored, so never sent)
            points = document["ingest"]["perf_points"]
            assert points["rate_per_s"] > 0 and points["fed"] > 0 and points["unattributed"] == 0
            assert document["ingest"]["membership"]["limits_sent"] is True

            # points of a worker outside the membership, or a rank beyond its DP size, are never fed
            step = msgspec.structs.astuple(ScheduledRequests(num_decode_requests=3, sum_decode_kv_tokens=1000))
            foreign = [PerfPoint("ghost", 0, 1, 0.02, step), PerfPoint("w0", 3, 1, 0.02, step)]
            payloads = [*encode_perf_points("s0", 10**6, foreign), b"not points"]
            asyncio.run(_publish_as_shard(server, perf_points_subject(NS, "s0"), payloads))

            def refused() -> dict[str, Any] | None:
                points = _diagnostics(served)["ingest"]["perf_points"]
                return points if points["bad_messages"] == 1 and points["unattributed"] == 2 else None

            wait_for(refused, timeout_s=20)
    finally:
        stop_process(proc)
        fleet.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", r"ingest\.shards\.perf_points_per_s: expected float >= 0\.0"),
        (".nan", r"ingest\.shards\.perf_points_per_s: expected float >= 0\.0"),
        (".inf", r"ingest\.shards: perf_points_per_s: expected a finite number >= 0, got inf"),
        ("fast", r"ingest\.shards\.perf_points_per_s: expected float, got str"),
    ],
)
def test_a_points_rate_that_is_not_a_finite_rate_is_refused_naming_the_field(
    tmp_path: Path, value: str, message: str
) -> None:
    config = tmp_path / "planner.yaml"
    config.write_text(f"ingest:\n  transport: nats\n  shards:\n    perf_points_per_s: {value}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(config, {})
    config.write_text("ingest:\n  transport: nats\n  shards:\n    perf_points_per_s: 0\n")
    assert load_config(config, {}).ingest.shards.perf_points_per_s == 0.0  # none: a valid rate
    assert load_config(None, {}).ingest.shards.perf_points_per_s == DEFAULT_PERF_POINTS_PER_S


@pytest.mark.parametrize(
    ("shards", "perf_model", "announced"),
    [
        ({"perf_points_per_s": 96}, None, 96.0),
        ({}, None, DEFAULT_PERF_POINTS_PER_S),
        ({"perf_points_per_s": 96}, {"enabled": False}, 0.0),  # no model to feed: the shards send none
    ],
)
def test_the_configured_points_rate_reaches_the_membership_the_shards_follow(
    server: NatsServer,
    tmp_path: Path,
    shards: dict[str, Any],
    perf_model: dict[str, Any] | None,
    announced: float,
) -> None:
    runner = _runner(tmp_path, server, None, limits=False, shards=shards, perf_model=perf_model)
    ingest = runner.ingest
    assert isinstance(ingest, ShardedIngest)
    assert (ingest.perf_points is None) is (announced == 0)  # nothing subscribed to points nobody learns from
    workers = worker_records(3, dp=1)
    try:
        ingest.start()
        with MembershipFollower(servers=[server.url], namespace=NS, user="s0", password="ps") as follower:

            def followed() -> bool:
                ingest.after_discovery(workers, leader=True)  # publishes once NATS is connected
                return follower.arrived.is_set()

            wait_for(followed, timeout_s=20)
            with follower.lock:
                rate_per_s = follower.assembler.perf_points_per_s
            assert follower.take() is not None
        assert rate_per_s == announced and math.isfinite(rate_per_s)
        assert ingest.diagnostics()["perf_points"]["rate_per_s"] == announced
    finally:
        runner.close()


async def _shard_traffic(server: NatsServer, shard_id: str, fresh_ranks: int, summaries: int) -> tuple[int, int]:
    """Listen to ``shard_id``'s subjects (one subscription: its messages arrive in the order it published them)
    until ``summaries`` of its summaries with ``fresh_ranks`` fresh ranks arrived; the perf-point messages it
    published meanwhile, and the summaries seen."""
    nc = await nats.connect(servers=[server.url], user="planner", password="pp")
    try:
        sub = await nc.subscribe(f"fpm-shard.{NS}.>")
        points_subject, own_summaries = perf_points_subject(NS, shard_id), summary_subject(NS, shard_id)
        points = seen = full = 0
        while full < summaries:
            msg = await sub.next_msg(timeout=30)
            if msg.subject == points_subject:
                points += 1
            elif msg.subject == own_summaries:
                seen += 1
                full += decode_summary(msg.data).fresh.count(1) == fresh_ranks
        return points, seen
    finally:
        await nc.close()


def test_with_the_perf_model_disabled_the_leader_announces_no_points_and_the_shard_sends_none(
    server: NatsServer, tmp_path: Path
) -> None:
    fleet = Fleet(server)
    runner = _runner(tmp_path, server, fleet, limits=False, perf_model={"enabled": False})
    assert isinstance(runner.ingest, ShardedIngest)
    proc = _shard_process(server, "s0")
    try:
        with serve_runner(runner):
            # five summaries of the shard with every rank fresh: it follows the membership and holds samples; at
            # 512 points/s it would have sent points after the second (each after its summary, on its connection)
            points, seen = asyncio.run(asyncio.wait_for(_shard_traffic(server, "s0", RANKS, 5), 90))
            assert seen >= 5 and points == 0
            diagnostics = runner.ingest.diagnostics()["perf_points"]
            assert diagnostics["rate_per_s"] == 0 and diagnostics["received"] == 0 and diagnostics["fed"] == 0
    finally:
        stop_process(proc)
        fleet.close()
