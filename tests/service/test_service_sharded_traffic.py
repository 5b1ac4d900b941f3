"""FPM traffic through sharded ingest: the same real setup as ``test_service_sharded`` (a planner served by
uvicorn over HTTP, a real nats-server, shim publishers with their relays, two ``python -m planner.shard``
processes following the leader), with every step sample carrying the traffic extension. The samples stay in the
shards; their summaries carry the traffic counters, and the service shows the traffic window in
``/v1/diagnostics`` and in a decision's explain as the unsharded service does (``test_service_traffic``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from planner.service.sharded_ingest import ShardedIngest
from planner.shard.partition import partition
from tests.planner.nats_support import NatsServer
from tests.service.support import serve_runner, stop_process, wait_for
from tests.service.test_service_sharded import (
    DECODE,
    DP,
    QUEUED_TOKENS,
    SHARDS,
    Fleet,
    _covered_by,
    _decisions,
    _diagnostics,
    _explain,
    _runner,
    _shard_process,
    server,
)
from tests.service.test_service_traffic import check_window, step_traffic
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.metrics import TrafficAccumulator

__all__ = ["server"]  # the nats-server fixture


class TrafficFleet(Fleet):
    """Every rank steps every 50 ms, each step with the traffic extension of :func:`step_traffic`."""

    def _step(self) -> None:
        acc = TrafficAccumulator()
        while not self._stop.wait(0.05):
            for pub in self.publishers:
                step_traffic(acc)
                wid = pub.worker_id
                pub.publish(
                    0.02,
                    ScheduledRequests(num_decode_requests=DECODE[wid], sum_decode_kv_tokens=1000),
                    QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=QUEUED_TOKENS[wid]),
                    traffic=acc.take(),
                )


def test_the_sharded_service_shows_the_fpm_traffic_of_every_shard_in_diagnostics_and_explain(
    server: NatsServer, tmp_path: Path
) -> None:
    owners = partition(DP, list(SHARDS))
    assert owners["s0"] and owners["s1"]  # each shard ingests some of the traffic
    fleet = TrafficFleet(server)
    runner = _runner(tmp_path, server, fleet)
    assert isinstance(runner.ingest, ShardedIngest)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for shard_id in SHARDS:
            procs[shard_id] = _shard_process(server, shard_id)
        with serve_runner(runner) as served:
            wait_for(lambda: _covered_by(served, list(SHARDS)), timeout_s=60)

            def both_shards_count_traffic() -> dict[str, Any] | None:
                document = _diagnostics(served)
                shards = {s["shard_id"]: s for s in document["ingest"]["shards"]}
                owning = all(shards.get(s, {}).get("workers") == len(owners[s]) for s in SHARDS)
                counted = all(shards.get(s, {}).get("traffic_services") == ["decode"] for s in SHARDS)
                window = document["traffic"].get("decode") or {}
                return document if owning and counted and (window.get("itl_samples_in_window") or 0) >= 20 else None

            document = wait_for(both_shards_count_traffic, timeout_s=60)
            assert {s["version"] for s in document["ingest"]["shards"]} == {2}
            assert document["ingest"]["traffic"]["summaries_applied"] > 0
            assert document["ingest"]["traffic"]["resets"] == 0
            # the same keys and figures as the unsharded service's window
            check_window(document["traffic"]["decode"])

            def explained_with_traffic() -> dict[str, Any] | None:
                for entry in _decisions(served)[:1]:
                    got = _explain(served, entry["id"])
                    if ((got.get("traffic") or {}).get("itl_samples_in_window") or 0) >= 20:
                        return got
                return None

            explained = wait_for(explained_with_traffic, timeout_s=30)
            traffic = explained["traffic"]
            check_window(traffic)
            # what the explain shows is what the core read
            inputs = explained["inputs"]
            assert inputs["request_rate_per_s"] == traffic["request_rate_per_s"]
            assert inputs["isl_tokens"] == traffic["isl_tokens"]
            assert inputs["osl_tokens"] == traffic["osl_tokens"]
    finally:
        for proc in procs.values():
            stop_process(proc)
        fleet.close()
