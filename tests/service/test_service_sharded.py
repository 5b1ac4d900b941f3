"""Sharded ingest through the real service (``ingest.shards.enabled``): a planner served by uvicorn over HTTP,
a real nats-server, shim publishers with their relays, and two ``python -m planner.shard`` processes that follow
the leader's membership (no workers file). The service decides from the shards' summaries; diagnostics list
every worker, rank and shard; a shard that joins takes its partition; a killed shard's workers move to the other
one, and meanwhile no scale-down is made on the missing data."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from planner.actuators.advisory import AdvisoryActuator
from planner.actuators.base import ReplicaBounds
from planner.errors import ConfigError
from planner.service.config import ServiceConfig, load_config
from planner.service.ingest_wiring import Ingest
from planner.service.runner import PlannerRunner
from planner.service.sharded_ingest import ShardedIngest
from planner.shard.partition import partition
from planner.transport.nats_config import render_server_config
from tests.planner.nats_support import NatsServer
from tests.service.support import AUTH, TOKEN, Served, serve_runner, stop_process, wait_for
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"
DP = {"w0": 1, "w1": 1, "w2": 1, "w3": 2}  # worker -> DP size: five ranks
DECODE = {"w0": 3, "w1": 4, "w2": 5, "w3": 6}  # num_decode_requests each rank of the worker publishes
QUEUED_TOKENS = {"w0": 100, "w1": 200, "w2": 300, "w3": 400}
RANKS = sum(DP.values())
SHARDS = ("s0", "s1")


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(
            port=port,
            namespace=NS,
            workers={w: "pw" for w in DP},
            consumers={"planner": "pp", **{s: "ps" for s in SHARDS}},
            consumer_publish=[f"fpm-shard.{NS}.>"],
        )

    (tmp_path / "nats").mkdir()
    with NatsServer(config, tmp_path / "nats") as srv:
        yield srv


def _distinct_ports(n: int) -> list[int]:
    """``n`` free loopback ports, all different (each held open until all are drawn)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class Fleet:
    """One shim publisher per rank (a step every 50 ms with the worker's fixed load) and a relay per worker."""

    def __init__(self, server: NatsServer) -> None:
        ports = iter(_distinct_ports(RANKS))
        self.ports = {w: [next(ports) for _ in range(dp)] for w, dp in DP.items()}
        self.publishers = [
            FpmPublisher(worker_id=w, dp_rank=r, endpoint=f"tcp://127.0.0.1:{p}", heartbeat_interval_s=1.0).start()
            for w, ports in self.ports.items()
            for r, p in enumerate(ports)
        ]
        self.relays = [
            FpmRelay(
                endpoints=[f"tcp://127.0.0.1:{p}" for p in ports],
                servers=[server.url],
                namespace=NS,
                service="decode",
                worker_id=w,
                password="pw",
            ).start()
            for w, ports in self.ports.items()
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._step, daemon=True)
        self._thread.start()

    def _step(self) -> None:
        while not self._stop.wait(0.05):
            for pub in self.publishers:
                wid = pub.worker_id
                pub.publish(
                    0.02,  # the step took 20 ms
                    ScheduledRequests(num_decode_requests=DECODE[wid], sum_decode_kv_tokens=1000),
                    QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=QUEUED_TOKENS[wid]),
                )

    def workers_yaml(self) -> dict[str, Any]:
        return {
            "workers": [
                {
                    "worker_id": w,
                    "role": "decode",
                    "service": "decode",
                    "dp_size": len(ports),
                    "fpm_endpoints": [f"tcp://127.0.0.1:{p}" for p in ports],
                }
                for w, ports in self.ports.items()
            ]
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for relay in self.relays:
            relay.close()
        for pub in self.publishers:
            pub.close()


def _runner(tmp_path: Path, server: NatsServer, fleet: Fleet) -> PlannerRunner:
    workers = tmp_path / "workers.yaml"
    workers.write_text(yaml.safe_dump(fleet.workers_yaml()))
    (tmp_path / "nats-password").write_text("pp\n")
    config = tmp_path / "planner.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tick_interval_s": 0.2,
                "discovery": {"static_file": str(workers)},  # the membership every 1 s
                "ingest": {
                    "transport": "nats",
                    "nats": {
                        "servers": [server.url],
                        "namespace": NS,
                        "user": "planner",
                        "password_file": str(tmp_path / "nats-password"),
                    },
                    "shards": {"enabled": True, "max_summary_age_s": 1.5},
                },
                # scale-downs are allowed at once: only the coverage gate can hold one
                "core": {
                    "roles": {
                        "decode": {
                            "scale_down_window_startups": 0,
                            "scale_down": {
                                "stabilization_window_s": 0,
                                "policies": [{"kind": "percent", "value": 100, "period_s": 15}],
                            },
                        }
                    }
                },
            }
        )
    )
    actuator = AdvisoryActuator({"decode": ReplicaBounds(min_replicas=1, max_replicas=8)}, replicas={"decode": 4})
    return PlannerRunner(load_config(config, {"FPM_PLANNER_TOKEN": TOKEN}), actuator=actuator)


def _shard_process(server: NatsServer, shard_id: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "planner.shard", "--shard-id", shard_id, "--nats-url", server.url]
    cmd += ["--namespace", NS, "--summary-interval-s", "0.2"]
    return subprocess.Popen(cmd, env={**os.environ, "FPM_NATS_PASSWORD": "ps"}, stderr=subprocess.DEVNULL)


def _diagnostics(served: Served) -> dict[str, Any]:
    response = served.http.get("/v1/diagnostics", headers=AUTH)
    response.raise_for_status()
    document: dict[str, Any] = response.json()
    return document


def _fresh_ranks(document: dict[str, Any]) -> int:
    return sum(rank["fresh"] for worker in document["workers"] for rank in worker["ranks"])


def _live(document: dict[str, Any]) -> list[str]:
    return sorted(s["shard_id"] for s in document["ingest"]["shards"] if s["live"])


def _covered_by(served: Served, shards: list[str]) -> bool:
    """``shards`` are the live ones, the last membership named them, and every rank is fresh through them."""
    document = _diagnostics(served)
    return (
        _live(document) == shards
        and document["ingest"]["membership"]["shards"] == shards
        and _fresh_ranks(document) == RANKS
    )


def _partitioned(served: Served, owners: dict[str, list[str]]) -> bool:
    """Each shard reports the workers the partition gives it, and every worker is healthy."""
    document = _diagnostics(served)
    reported = {s["shard_id"]: s["workers"] for s in document["ingest"]["shards"]}
    healthy = [w["classification"] == "healthy" for w in document["workers"]]
    return reported == {s: len(owners[s]) for s in owners} and len(healthy) == len(DP) and all(healthy)


def _decisions(served: Served) -> list[dict[str, Any]]:
    response = served.http.get("/v1/decisions", params={"role": "decode", "limit": 1000}, headers=AUTH)
    response.raise_for_status()
    decisions: list[dict[str, Any]] = response.json()["decisions"]
    return decisions


def _explain(served: Served, decision_id: int) -> dict[str, Any]:
    response = served.http.get(f"/v1/decisions/{decision_id}/explain", headers=AUTH)
    response.raise_for_status()
    explained: dict[str, Any] = response.json()
    return explained


def test_the_service_decides_from_shard_processes_that_join_and_leave_and_never_scales_down_on_missing_data(
    server: NatsServer, tmp_path: Path
) -> None:
    owners = partition(DP, list(SHARDS))
    assert owners["s0"] and owners["s1"]  # both shards own workers: killing s1 moves some
    fleet = Fleet(server)
    runner = _runner(tmp_path, server, fleet)
    assert isinstance(runner.ingest, ShardedIngest)
    procs = {"s0": _shard_process(server, "s0")}
    try:
        with serve_runner(runner) as served:
            # s0 alone: live, told every worker, every rank fresh through it
            wait_for(lambda: _covered_by(served, ["s0"]), timeout_s=60)
            # s1 joins: it starts owning nothing, the leader hears it and gives it its partition
            procs["s1"] = _shard_process(server, "s1")
            wait_for(lambda: _covered_by(served, ["s0", "s1"]), timeout_s=60)
            # the rendezvous partition over both, every worker healthy again (a moved one once its new owner heard it)
            wait_for(lambda: _partitioned(served, owners), timeout_s=30)
            document = _diagnostics(served)
            assert document["ingest"]["mode"] == "sharded"
            assert {w["worker_id"]: len(w["ranks"]) for w in document["workers"]} == DP

            # a decision made on full coverage has the load the publishers sent, summed over every rank
            def full_decision() -> dict[str, Any] | None:
                newest = _decisions(served)[:1]
                if newest and newest[0]["decision"]["inputs"]["engines_reporting"] == RANKS:
                    return _explain(served, newest[0]["id"])
                return None

            explained = wait_for(full_decision, timeout_s=30)
            inputs = explained["inputs"]
            assert inputs["engines_expected"] == RANKS
            assert inputs["decode_requests"] == sum(DECODE[w] * DP[w] for w in DP)
            assert inputs["queued_prefill_tokens"] == sum(QUEUED_TOKENS[w] * DP[w] for w in DP)
            assert explained["coverage"]["complete"] is True
            # on complete coverage this light load is a scale-down (only the coverage gate can hold one)
            assert explained["action"] == "scale_down"

            # kill s1: its workers are silent until its summary is stale and s0, told so, takes them over
            killed_at = time.monotonic()
            last_id = _decisions(served)[0]["id"]
            procs["s1"].send_signal(signal.SIGKILL)
            procs["s1"].wait(15)
            wait_for(lambda: _covered_by(served, ["s0"]), timeout_s=60)
            moved_in_s = time.monotonic() - killed_at
            document = _diagnostics(served)
            s1 = next(s for s in document["ingest"]["shards"] if s["shard_id"] == "s1")
            assert s1["live"] is False and s1["summary_age_s"] > 1.5
            s0 = next(s for s in document["ingest"]["shards"] if s["shard_id"] == "s0")
            assert s0["workers"] == len(DP) and s0["ranks"] == RANKS
            print(f"s1's workers covered by s0 {moved_in_s:.1f} s after the kill (ttl_s 10)")

            # every decision since the kill: on incomplete coverage, held by the coverage gate, never a scale-down
            since = [d for d in _decisions(served) if d["id"] > last_id]
            gaps = [d for d in since if not d["decision"]["coverage"]["complete"]]
            assert gaps  # the gap was seen (the killed shard's workers were silent for a while)
            for entry in gaps:
                assert entry["action"] != "scale_down"
                assert "workers_silent" in entry["reasons"] and "scale_down_blocked" in entry["reasons"]
                assert entry["decision"]["inputs"]["engines_reporting"] < RANKS
    finally:
        for proc in procs.values():
            stop_process(proc)
        fleet.close()


@pytest.mark.parametrize(
    ("ingest", "message"),
    [
        ({"shards": {"enabled": True}}, "shards.enabled needs transport: nats"),
        (
            {"transport": "nats", "ttl_s": 2, "shards": {"enabled": True, "max_summary_age_s": 3}},
            "shards.max_summary_age_s must be <= ttl_s",
        ),
        ({"transport": "nats", "shards": {"enabled": True, "max_age_s": 3}}, "unknown field"),
    ],
)
def test_a_sharded_ingest_that_cannot_work_is_refused_naming_the_setting(
    tmp_path: Path, ingest: dict[str, Any], message: str
) -> None:
    config = tmp_path / "planner.yaml"
    config.write_text(yaml.safe_dump({"ingest": ingest}))
    with pytest.raises(ConfigError, match=message):
        load_config(config, {})


def test_without_shards_a_short_ttl_stays_valid_and_the_ingest_is_the_local_store() -> None:
    config = load_config(None, {"FPM_PLANNER_TOKEN": TOKEN})
    assert config.ingest.shards.enabled is False
    short = msgspec.convert({"ingest": {"ttl_s": 2}}, ServiceConfig)
    assert short.ingest.ttl_s == 2
    runner = PlannerRunner(config)
    assert isinstance(runner.ingest, Ingest) and runner.ingest.diagnostics() == {}
    runner.subscriber.close()
