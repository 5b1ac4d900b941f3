"""What the sharded service learns beyond the summaries' totals, through the real setup of
``test_service_sharded`` (a planner served by uvicorn over HTTP, a real nats-server, shim publishers with their
relays, a ``python -m planner.shard`` process following the leader):

- the shard checks samples against the planner's ``ingest.limits`` (sent in the membership), not the defaults;
- ``/v1/diagnostics`` shows each rank's sample counters and ages as the shard counted them, not zeros;
- the perf model is fed the shard's training points (``fpm-shard.<ns>.perf.v1.<shard>``), and the leader refuses
  points of workers outside its membership."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import nats
import yaml

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import ReplicaBounds
from planner.service.config import load_config
from planner.service.runner import PlannerRunner
from planner.service.sharded_ingest import ShardedIngest
from planner.shard.perf_points import PerfPoint, encode_perf_points, perf_points_subject
from tests.planner.nats_support import NatsServer
from tests.service.support import TOKEN, serve_runner, wait_for
from tests.service.test_service_sharded import DECODE, DP, NS, RANKS, Fleet, _diagnostics, _shard_process, server
from worker_shim.fpm import ScheduledRequests

__all__ = ["server"]  # the nats-server fixture

MAX_REQUESTS = 5  # the planner's limit: w3's ranks publish 6 decode requests a step, beyond it


def _runner(tmp_path: Path, server: NatsServer, fleet: Fleet) -> PlannerRunner:
    workers = tmp_path / "workers.yaml"
    workers.write_text(yaml.safe_dump(fleet.workers_yaml()))
    (tmp_path / "nats-password").write_text("pp\n")
    config = tmp_path / "planner.yaml"
    nats_settings = {
        "servers": [server.url],
        "namespace": NS,
        "user": "planner",
        "password_file": str(tmp_path / "nats-password"),
    }
    config.write_text(
        yaml.safe_dump(
            {
                "tick_interval_s": 0.2,
                "discovery": {"static_file": str(workers)},
                "ingest": {
                    "transport": "nats",
                    "nats": nats_settings,
                    "shards": {"enabled": True, "max_summary_age_s": 1.5},
                    "limits": {"max_requests": MAX_REQUESTS},
                },
            }
        )
    )
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
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        fleet.close()
