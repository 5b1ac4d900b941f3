"""``fpm-worker``'s own NATS relay (``worker_shim.relay_supervisor``): the flags that turn it on, and the child
process it keeps running, against real shim publishers (two DP ranks) and a real nats-server, read by a real
``NatsFpmSource``: FPM arrives for every rank; a killed relay is restarted and the samples lost meanwhile are
counted as a gap; a relay that cannot run is retried with backoff and never raises; closing stops the child."""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetStore
from planner.transport.nats_source import NatsFpmSource
from tests.fakes.tiny_vllm import free_port_base
from tests.planner.nats_support import NatsServer, server_config, wait_until
from worker_shim.launcher import LauncherSettings, add_launcher_arguments
from worker_shim.publisher import FpmPublisher
from worker_shim.relay_supervisor import RelaySettings, RelaySupervisor

NS = "prod"
WORKER = "w1"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_launcher_arguments(parser)
    parser.add_argument("--model", default="org/model")
    return parser.parse_args(list(argv))


BASE = ("--worker-id", WORKER, "--register-file", "w.yaml")


def test_without_a_nats_url_there_is_no_relay() -> None:
    assert LauncherSettings.from_args(_args(*BASE), {}).relay is None


def test_the_flags_give_the_relay_its_command_and_the_password_only_in_its_environment(tmp_path: Path) -> None:
    secret = tmp_path / "nats-password"
    secret.write_text("s3cret\n")
    argv = [*BASE, "--service", "decode", "--relay-nats-url", "nats://a:4222", "--relay-nats-url", "nats://b:4222"]
    argv += ["--relay-namespace", NS, "--relay-user", "u1", "--relay-password-file", str(secret)]
    argv += ["--relay-arg=--some-flag", "--relay-arg=7"]
    settings = LauncherSettings.from_args(_args(*argv), {"FPM_PORT_BASE": "21000", "FPM_BIND_HOST": "*"})
    relay = settings.relay
    assert relay is not None
    cmd = relay.command(4, python="py")
    assert cmd == [
        "py", "-m", "worker_shim.relay", "--nats-url", "nats://a:4222", "--nats-url", "nats://b:4222",
        "--namespace", NS, "--service", "decode", "--worker-id", WORKER, "--dp-size", "4",
        "--host", "127.0.0.1", "--port-base", "21000", "--some-flag", "7",
    ]  # fmt: skip
    env = relay.child_env({"PATH": "/bin", "FPM_NATS_PASSWORD": "stale"})
    assert env == {"PATH": "/bin", "FPM_NATS_USER": "u1", "FPM_NATS_PASSWORD": "s3cret"}
    assert "s3cret" not in " ".join(cmd)


def test_the_environment_turns_the_relay_on_and_the_shims_bind_address_is_where_it_reads() -> None:
    env = {"FPM_RELAY_NATS_URL": "nats://a:4222, nats://b:4222", "FPM_RELAY_NAMESPACE": NS}
    env |= {"FPM_NATS_PASSWORD": "pw", "FPM_BIND_HOST": "10.0.0.5"}
    relay = LauncherSettings.from_args(_args(*BASE), env).relay
    assert relay is not None
    assert relay.nats_urls == ("nats://a:4222", "nats://b:4222") and relay.namespace == NS
    assert (relay.host, relay.service, relay.user, relay.password) == ("10.0.0.5", "org/model", None, "pw")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (("--relay-nats-url", "nats://a:4222"), {}, "--relay-namespace"),
        (("--relay-namespace", NS), {}, "need --relay-nats-url"),
        (("--relay-arg=--x",), {}, "need --relay-nats-url"),
        (("--relay-nats-url", "nats://a", "--relay-namespace", NS, "--relay-password-file", "/nonexistent/p"), {},
         "--relay-password-file"),
        (("--relay-nats-url", "nats://a", "--relay-namespace", NS), {"FPM_CURVE_SECRET_KEY_FILE": "/k/server.key"},
         "CURVE"),
    ],
)  # fmt: skip
def test_bad_relay_settings_name_the_flag(argv: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LauncherSettings.from_args(_args(*BASE, *argv), env)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(server_config(NS, workers={WORKER: "pw1"}, consumers={"planner": "pp"}), tmp_path) as srv:
        yield srv


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_relay_is_restarted_and_the_gap_is_counted_on_every_rank(server: NatsServer, tmp_path: Path) -> None:
    dp = 2
    base = free_port_base(dp)
    publishers = [
        FpmPublisher(worker_id=WORKER, dp_rank=r, host="127.0.0.1", base_port=base, heartbeat_interval_s=0.05)
        for r in range(dp)
    ]
    store = FleetStore(ttl_s=30.0)
    source = NatsFpmSource(store, servers=[server.url], namespace=NS, user="planner", password="pp")
    endpoints = tuple(f"tcp://127.0.0.1:{base + r}" for r in range(dp))
    source.set_workers(
        {WORKER: WorkerRecord(worker_id=WORKER, role=Role.AGG, service="agg", dp_size=dp, fpm_endpoints=endpoints)}
    )
    settings = RelaySettings(
        nats_urls=(server.url,), namespace=NS, service="agg", worker_id=WORKER, user=None, password="pw1",
        host="127.0.0.1", port_base=base,
    )  # fmt: skip
    supervisor = RelaySupervisor(settings, dp, backoff_initial_s=0.5, log_path=tmp_path / "relay.log")
    for pub in publishers:
        pub.start()
    try:
        with source, supervisor:
            assert source.wait_subscribed(15)

            def heard(at_least: int) -> bool:
                views = [store.rank_view(WORKER, r, time.monotonic()) for r in range(dp)]
                return all(v.heartbeats >= at_least for v in views)

            wait_until(lambda: heard(3), timeout_s=60, what="heartbeats of every rank through the relay")
            first = supervisor.pid
            assert first is not None and supervisor.restarts == 0
            before = [store.rank_view(WORKER, r, time.monotonic()).heartbeats for r in range(dp)]
            os.kill(first, signal.SIGKILL)
            wait_until(lambda: supervisor.restarts == 1 and supervisor.pid is not None, timeout_s=30, what="restart")
            assert supervisor.pid != first and supervisor.last_exit_code == -signal.SIGKILL

            def resumed() -> bool:
                views = [store.rank_view(WORKER, r, time.monotonic()) for r in range(dp)]
                return all(v.heartbeats >= b + 3 and v.gaps >= 1 for v, b in zip(views, before, strict=True))

            wait_until(resumed, timeout_s=60, what="ingest resumed on every rank with the gap counted")
            for r in range(dp):
                view = store.rank_view(WORKER, r, time.monotonic())
                # >= 0.5 s of backoff at 20 heartbeats/s: at least ~10 lost, counted, not silently skipped
                assert view.lost_samples >= 5 and view.restarts == 0
            assert sum(store.drops.values()) == 0
            second = supervisor.pid
        assert second is not None
        wait_until(lambda: not _alive(second), timeout_s=5, what="the relay child stopped with the supervisor")
        assert supervisor.pid is None and supervisor.restarts == 1
    finally:
        for pub in publishers:
            pub.close()


def test_a_relay_that_cannot_run_is_retried_with_backoff_and_never_raises(tmp_path: Path) -> None:
    settings = RelaySettings(
        nats_urls=("nats://127.0.0.1:1",), namespace=NS, service="agg", worker_id=WORKER, user=None, password=None,
        host="127.0.0.1", port_base=20380, extra_args=("--no-such-relay-flag",),
    )  # fmt: skip
    with RelaySupervisor(settings, 1, backoff_initial_s=0.05, backoff_max_s=0.2, log_path=tmp_path / "r.log") as sup:
        wait_until(lambda: sup.restarts >= 2, timeout_s=60, what="two restarts")
        assert sup.last_exit_code == 2  # argparse refused the pass-through flag
    assert "--no-such-relay-flag" in (tmp_path / "r.log").read_text()
