"""The shard StatefulSet the chart renders, run as the kubelet would run its pods (its command and arguments, its
``$(POD_NAME)``, its ConfigMap and Secret volumes laid out as files, its Secret env), against a real nats-server
with real publishers and relays, in both modes: following the leader (the test publishes the leader's membership
messages with ``planner.shard.membership``, as the planner's leader does) and from a workers file. Both shards
start, each covers its partition, and the merge of their summaries sees every rank fresh."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from planner.discovery import StaticFileDiscovery
from planner.shard.membership import membership_parts, membership_subject
from planner.shard.merge import SummaryMerger
from planner.shard.process import SummaryListener
from planner.transport.nats_config import render_server_config
from tests.k8s.test_k8s_chart_ingest import one, render
from tests.planner.nats_support import NatsServer, free_port, wait_until
from worker_shim.publisher import FpmPublisher
from worker_shim.relay import FpmRelay

pytestmark = pytest.mark.kubernetes

NS = "prod"
WORKERS = [f"w{i}" for i in range(4)]
SECRETS = {"fpm-nats": {"password": "pp"}}


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    def config(port: int) -> str:
        return render_server_config(
            port=port,
            namespace=NS,
            workers={w: "pw" for w in WORKERS},
            consumers={"planner": "pp"},
            consumer_publish=[f"fpm-shard.{NS}.>"],
        )

    with NatsServer(config, tmp_path) as srv:
        yield srv


def run_pod(
    pod_name: str, sts: dict[str, Any], config_maps: dict[str, dict[str, str]], root: Path
) -> subprocess.Popen[bytes]:
    """Start the StatefulSet's only container as pod ``pod_name``: volumes as files under ``root``, env resolved,
    ``$(VAR)`` expanded, mount paths mapped under ``root``; ``python`` is this interpreter."""
    spec = sts["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in ctr.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        target = root / pod_name / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]
        else:
            data = SECRETS[volume["secret"]["secretName"]]
        for key, text in data.items():
            (target / key).write_text(text)
        mounts[mount["mountPath"]] = target
    env: dict[str, str] = {}
    for var in ctr["env"]:
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[var["name"]] = pod_name
        elif "secretKeyRef" in source:
            env[var["name"]] = SECRETS[source["secretKeyRef"]["name"]][source["secretKeyRef"]["key"]]
        else:
            env[var["name"]] = var["value"]
    argv = []
    for arg in [*ctr["command"], *ctr["args"]]:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        for path, target in mounts.items():
            arg = arg.replace(path, str(target))
        argv.append(arg)
    assert argv[0] == "python"
    return subprocess.Popen([sys.executable, *argv[1:]], env=env | {"PATH": "/usr/bin:/bin"})


class Leader:
    """Publishes the leader's membership (the workers and the live shard set), at most every 0.5 s."""

    def __init__(self, server: NatsServer, shards: list[str], workers_file: Path) -> None:
        self.server = server
        self.shards = shards
        self.workers = StaticFileDiscovery(workers_file).workers(0.0)
        self.seq = 0
        self.last_s = 0.0

    def tick(self) -> None:
        if time.monotonic() - self.last_s < 0.5:
            return
        self.last_s = time.monotonic()
        self.seq += 1
        parts = membership_parts(
            leader="planner-0", seq=self.seq, taken_at=time.time(), shards=self.shards, workers=self.workers
        )

        async def publish() -> None:
            nc = await nats.connect(servers=[self.server.url], user="planner", password="pp")
            for part in parts:
                await nc.publish(membership_subject(NS), part)
            await nc.drain()

        asyncio.run(publish())


@pytest.mark.parametrize("mode", ["leader", "file"])
def test_the_rendered_shards_run_and_cover_every_rank(mode: str, server: NatsServer, tmp_path: Path) -> None:
    ports = {w: free_port() for w in WORKERS}
    entries = [
        {"worker_id": w, "role": "decode", "service": "decode", "dp_size": 1, "fpm_endpoints": [f"tcp://127.0.0.1:{p}"]}
        for w, p in ports.items()
    ]
    workers_yaml = yaml.safe_dump({"workers": entries})
    docs = render(
        {
            "ingest": {
                "transport": "nats",
                "nats": {"servers": [server.url], "namespace": NS, "user": "planner", "existingSecret": "fpm-nats"},
            },
            "shards": {
                "replicas": 2,
                "summaryIntervalS": 0.2,
                "workersConfigMap": {"name": "fleet-workers" if mode == "file" else ""},
            },
        }
    )
    sts = one(docs, "StatefulSet", "rel-fpm-planner-shard")
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    config_maps["fleet-workers"] = {"workers.yaml": workers_yaml}
    (tmp_path / "workers.yaml").write_text(workers_yaml)
    publishers = [
        FpmPublisher(worker_id=w, endpoint=f"tcp://127.0.0.1:{p}", heartbeat_interval_s=0.05).start()
        for w, p in ports.items()
    ]
    relays = [
        FpmRelay(
            endpoints=[f"tcp://127.0.0.1:{p}"], servers=[server.url], namespace=NS, service="decode", worker_id=w,
            password="pw",
        ).start()
        for w, p in ports.items()
    ]  # fmt: skip
    merger = SummaryMerger(ttl_s=10.0, max_summary_age_s=2.0)
    merger.set_workers(StaticFileDiscovery(tmp_path / "workers.yaml").workers(0.0))
    listener = SummaryListener(merger, servers=[server.url], namespace=NS, user="planner", password="pp").start()
    pods = [f"rel-fpm-planner-shard-{i}" for i in range(sts["spec"]["replicas"])]
    procs = [run_pod(name, sts, config_maps, tmp_path / "pods") for name in pods]
    leader = Leader(server, pods, tmp_path / "workers.yaml")

    def covered() -> bool:
        if mode == "leader":
            leader.tick()
        with listener.lock:
            snap = merger.snapshot(time.time())
            heard = set(merger.shards(time.time()))
        return heard == set(pods) and int(snap.totals.fresh.sum()) == len(WORKERS)

    try:
        wait_until(covered, timeout_s=60, what="both rendered shards heard and every rank fresh")
        assert listener.bad_summaries == 0
        assert [proc.poll() for proc in procs] == [None, None]  # both still running
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        listener.close()
        for relay in relays:
            relay.close()
        for pub in publishers:
            pub.close()
