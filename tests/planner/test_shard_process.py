"""Two ``python -m planner.shard`` processes against a real nats-server and relays: the leader's merged snapshot
sees every rank; one shard leaves the shard set and stops, the other takes its workers over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from planner.discovery import StaticFileDiscovery
from planner.shard.merge import SummaryMerger
from planner.shard.partition import partition
from planner.shard.process import SummaryListener
from planner.transport.nats_config import render_server_config
from tests.planner.nats_support import NatsServer, free_port, wait_until
from tests.service.support import stop_process
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

NS = "prod"
WORKERS = [f"w{i}" for i in range(6)]


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(
            port=port,
            namespace=NS,
            workers={w: "pw" for w in WORKERS},
            consumers={"s0": "ps", "s1": "ps", "leader": "pl"},
            consumer_publish=[f"fpm-shard.{NS}.>"],
        )

    with NatsServer(config, tmp_path) as srv:
        yield srv


def _shard(server: NatsServer, shard_id: str, workers_file: Path, shards_file: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "planner.shard", "--shard-id", shard_id, "--shards-file", str(shards_file)]
    cmd += ["--nats-url", server.url, "--namespace", NS, "--workers-file", str(workers_file)]
    cmd += ["--summary-interval-s", "0.2"]
    return subprocess.Popen(cmd, env={**os.environ, "FPM_NATS_PASSWORD": "ps"}, stderr=subprocess.DEVNULL)


def test_shard_processes_cover_every_rank_and_one_takes_over_when_the_other_leaves(
    server: NatsServer, tmp_path: Path
) -> None:
    assert partition(WORKERS, ["s0", "s1"])["s1"]  # s1 owns workers for s0 to take over
    ports = {w: free_port() for w in WORKERS}
    workers_file = tmp_path / "workers.yaml"
    entries = [
        {"worker_id": w, "role": "decode", "service": "decode", "dp_size": 1, "fpm_endpoints": [f"tcp://127.0.0.1:{p}"]}
        for w, p in ports.items()
    ]
    workers_file.write_text(yaml.safe_dump({"workers": entries}))
    shards_file = tmp_path / "shards"
    shards_file.write_text("s0\ns1\n")
    publishers = [
        FpmPublisher(worker_id=w, endpoint=f"tcp://127.0.0.1:{p}", heartbeat_interval_s=0.05).start()
        for w, p in ports.items()
    ]
    relays = [
        FpmRelay(
            endpoints=[f"tcp://127.0.0.1:{p}"],
            servers=[server.url],
            namespace=NS,
            service="decode",
            worker_id=w,
            password="pw",
        ).start()
        for w, p in ports.items()
    ]
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=1.0)
    merger.set_workers(StaticFileDiscovery(workers_file).workers(0.0))
    listener = SummaryListener(merger, servers=[server.url], namespace=NS, user="leader", password="pl").start()
    procs = {s: _shard(server, s, workers_file, shards_file) for s in ("s0", "s1")}

    def merged_fresh() -> int:
        with listener.lock:
            return int(merger.snapshot(time.time()).totals.fresh.sum())

    def heard_from(shard: str) -> bool:
        with listener.lock:
            return shard in merger.shards(time.time())

    try:
        wait_until(lambda: heard_from("s0") and heard_from("s1") and merged_fresh() == 6, timeout_s=60)
        # s1 leaves the shard set and stops; once its last summary has aged out, s0 alone covers every rank.
        shards_file.write_text("s0\n")
        procs["s1"].send_signal(signal.SIGTERM)
        assert procs["s1"].wait(15) == 0

        def s1_aged_out_and_all_fresh() -> bool:
            with listener.lock:
                age = merger.shards(time.time())["s1"]
            return age > 1.5 and merged_fresh() == 6

        wait_until(s1_aged_out_and_all_fresh, timeout_s=30, what="s0 covering s1's workers")
        assert listener.bad_summaries == 0
    finally:
        for proc in procs.values():
            stop_process(proc)
        listener.close()
        for relay in relays:
            relay.close()
        for pub in publishers:
            pub.close()


def test_a_shard_not_in_its_own_shard_set_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "workers.yaml").write_text("workers: []\n")
    cmd = [sys.executable, "-m", "planner.shard", "--shard-id", "s9", "--shards", "s0,s1", "--nats-url", "nats://x:1"]
    cmd += ["--namespace", NS, "--workers-file", str(tmp_path / "workers.yaml")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not among the shards" in done.stderr
