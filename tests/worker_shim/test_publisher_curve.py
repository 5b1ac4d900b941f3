"""Optional CURVE on the FPM link (issue 12, item 13), with real sockets and key files made by zmq.auth: an
unkeyed subscriber reads nothing, a keyed one reads everything; with an allowed-clients directory (ZAP) a keyed
subscriber whose key is not listed reads nothing either. And the shim's configuration of both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from planner.discovery import Role, WorkerRecord
from planner.errors import ConfigError
from planner.ingest.store import FleetStore
from planner.ingest.subscriber import FpmSubscriber
from tests.planner.test_subscriber import pump
from worker_shim.config import ShimConfig
from worker_shim.curve import CurveClientKeys, CurveKeyError, CurveServerKeys
from worker_shim.publisher import FpmPublisher


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (public certificate, secret certificate) for the publisher, the planner and a stranger."""
    made = {}
    (tmp_path / "keys").mkdir()
    for name in ("publisher", "planner", "stranger"):
        public, secret = zmq.auth.create_certificates(str(tmp_path / "keys"), name)
        made[name] = (str(public), str(secret))
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "planner.key").write_text(Path(made["planner"][0]).read_text())
    return made


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _subscriber(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, curve: CurveClientKeys | None) -> FpmSubscriber:
    sub = FpmSubscriber(FleetStore(ttl_s=60.0), context=ctx, curve=curve)
    sub.set_workers(
        {"w": WorkerRecord(worker_id="w", role=Role.AGG, service="agg", dp_size=1, fpm_endpoints=(endpoint,))}
    )
    return sub


def _heard(sub: FpmSubscriber) -> int:
    return sub.store.rank_view("w", 0, 0.0).heartbeats


def _race(readers: list[FpmSubscriber], keyed: FpmSubscriber, raw: zmq.Socket[bytes] | None = None) -> int:
    """Poll every subscriber in turn until ``keyed`` has read 30 heartbeats; returns what ``raw`` read."""
    raw_read = 0

    def done() -> bool:
        nonlocal raw_read
        for other in readers:
            other.poll_once(5)
        while raw is not None and raw.poll(0):
            raw.recv_multipart()
            raw_read += 1
        return _heard(keyed) >= 30

    pump(keyed, done, timeout_s=60)
    return raw_read


def test_only_a_subscriber_with_the_server_key_reads_fpm(
    ctx: zmq.Context[zmq.Socket[bytes]], keys: dict[str, tuple[str, str]]
) -> None:
    server = CurveServerKeys.from_files(keys["publisher"][1])
    pub = FpmPublisher(
        worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.01, context=ctx, curve=server
    ).start()
    endpoint = pub.bound_endpoint or ""
    keyed = _subscriber(ctx, endpoint, CurveClientKeys.from_files(keys["publisher"][0]))
    unkeyed = _subscriber(ctx, endpoint, None)
    wrong = _subscriber(ctx, endpoint, CurveClientKeys.from_files(keys["stranger"][0]))  # another server key
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.connect(endpoint)
    try:
        raw_read = _race([unkeyed, wrong], keyed, raw)
        assert _heard(keyed) >= 30
        assert _heard(unkeyed) == 0 and unkeyed.received == 0 and raw_read == 0
        assert _heard(wrong) == 0 and wrong.received == 0
        assert unkeyed.links()[endpoint].connections == 0  # no handshake ever completed
    finally:
        for sub in (keyed, unkeyed, wrong):
            sub.close()
        raw.close(linger=0)
        pub.close()


def test_allowed_clients_keep_out_a_subscriber_whose_key_is_not_listed(
    keys: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    server = CurveServerKeys.from_files(keys["publisher"][1], str(tmp_path / "allowed"))
    pub = FpmPublisher(worker_id="w", endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.01, curve=server).start()
    endpoint = pub.bound_endpoint or ""
    sub_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    planner = _subscriber(sub_ctx, endpoint, CurveClientKeys.from_files(keys["publisher"][0], keys["planner"][1]))
    stranger = _subscriber(sub_ctx, endpoint, CurveClientKeys.from_files(keys["publisher"][0], keys["stranger"][1]))
    try:
        _race([stranger], planner)
        assert _heard(planner) >= 30
        assert _heard(stranger) == 0 and stranger.received == 0
    finally:
        planner.close()
        stranger.close()
        pub.close()
        sub_ctx.destroy(linger=0)


def test_key_files_that_cannot_be_used_are_named(keys: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    with pytest.raises(CurveKeyError, match="no secret key"):
        CurveServerKeys.from_files(keys["publisher"][0])  # the public certificate
    with pytest.raises(CurveKeyError, match=r"missing\.key"):
        CurveClientKeys.from_files(str(tmp_path / "missing.key"))
    with pytest.raises(CurveKeyError, match="does not exist"):
        CurveServerKeys.from_files(keys["publisher"][1], str(tmp_path / "nowhere"))


def test_the_shim_reads_its_curve_keys_and_bind_host_from_the_environment(
    keys: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    assert ShimConfig.from_env({}).curve() is None and ShimConfig.from_env({}).endpoint(0) == "tcp://*:20380"
    env = {
        "FPM_BIND_HOST": "10.1.2.3",
        "FPM_CURVE_SECRET_KEY_FILE": keys["publisher"][1],
        "FPM_CURVE_CLIENTS_DIR": str(tmp_path / "allowed"),
    }
    config = ShimConfig.from_env(env)
    assert config.endpoint(1) == "tcp://10.1.2.3:20381"
    curve = config.curve()
    assert curve is not None and curve.allowed_clients_dir == str(tmp_path / "allowed")
    assert curve.public_key == zmq.auth.load_certificate(keys["publisher"][0])[0]
    assert ShimConfig.from_env(config.to_env()) == config
    with pytest.raises(ConfigError, match="FPM_CURVE_SECRET_KEY_FILE"):
        ShimConfig.from_env({"FPM_CURVE_SECRET_KEY_FILE": keys["publisher"][0]}).curve()
    with pytest.raises(ConfigError, match="FPM_CURVE_CLIENTS_DIR needs"):
        ShimConfig.from_env({"FPM_CURVE_CLIENTS_DIR": str(tmp_path)})
