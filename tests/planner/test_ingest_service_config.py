"""The planner service's ingest settings (issue 12): plausibility limits and CURVE keys from its config file,
with a real CURVE publisher and the real service."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq.auth

from planner.errors import ConfigError
from planner.ingest.store import DropReason
from planner.service.config import load_config
from tests.service.support import AUTH, TOKEN, registration, serve, wait_for
from worker_shim.curve import CurveKeyError, CurveServerKeys
from worker_shim.fpm import QueuedRequests, ScheduledRequests
from worker_shim.publisher import FpmPublisher


def test_the_service_reads_a_curve_publisher_and_applies_its_configured_limits(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(str(keys), "publisher")
    config_file = tmp_path / "planner.yaml"
    config_file.write_text(
        f"ingest:\n  curve_server_public_key_file: {server_public}\n  limits: {{max_requests: 10}}\n"
    )
    config = load_config(config_file, {"FPM_PLANNER_TOKEN": TOKEN, "FPM_PLANNER_TICK_INTERVAL_S": "0.2"})
    pub = FpmPublisher(
        worker_id="w",
        endpoint="tcp://127.0.0.1:*",
        heartbeat_interval_s=0.02,
        curve=CurveServerKeys.from_files(str(server_secret)),
    ).start()
    try:
        with serve(config) as served:
            served.http.put("/v1/workers/w", json=registration([pub.bound_endpoint or ""]), headers=AUTH)
            store = served.runner.store
            wait_for(lambda: store.rank_view("w", 0, 0.0).heartbeats >= 3)  # through CURVE
            pub.publish(0.01, ScheduledRequests(num_decode_requests=11), QueuedRequests())
            wait_for(lambda: store.drops[DropReason.INVALID_VALUE] >= 1)
            pub.publish(0.01, ScheduledRequests(num_decode_requests=10), QueuedRequests())
            wait_for(lambda: store.rank_view("w", 0, 0.0).samples >= 1)
    finally:
        pub.close()


def test_a_missing_curve_key_file_refuses_to_start(tmp_path: Path) -> None:
    config_file = tmp_path / "planner.yaml"
    config_file.write_text(f"ingest: {{curve_server_public_key_file: {tmp_path / 'nope.key'}}}\n")
    config = load_config(config_file, {"FPM_PLANNER_TOKEN": TOKEN})
    with pytest.raises(ConfigError, match=r"ingest\.curve_server_public_key_file .*nope") as raised:
        config.ingest.curve_keys()
    assert isinstance(raised.value.__cause__, CurveKeyError)


def test_the_subscriber_runs_its_rounds_at_the_configured_interval(tmp_path: Path) -> None:
    config_file = tmp_path / "planner.yaml"
    config_file.write_text("ingest: {round_interval_s: 0.25}\n")
    config = load_config(config_file, {"FPM_PLANNER_TOKEN": TOKEN})
    with serve(config) as served:
        assert served.runner.subscriber.min_poll_interval_s == 0.25


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_a_round_interval_outside_0_to_1_s_refuses_to_start(tmp_path: Path, value: str) -> None:
    config_file = tmp_path / "planner.yaml"
    config_file.write_text(f"ingest: {{round_interval_s: {value}}}\n")
    with pytest.raises(ConfigError, match=r"ingest\.round_interval_s: expected float (>=|<=) (0|1)\.0"):
        load_config(config_file, {"FPM_PLANNER_TOKEN": TOKEN})
