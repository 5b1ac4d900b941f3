"""ShimConfig from an environment mapping: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from planner.errors import ConfigError
from worker_shim.config import ShimConfig


def test_defaults_when_nothing_is_set() -> None:
    config = ShimConfig.from_env({})
    assert config == ShimConfig(worker_id="", port_base=20380, bind_host="*", heartbeat_interval_s=1.0)
    assert config.endpoint(0) == "tcp://*:20380"
    assert config.endpoint(3) == "tcp://*:20383"


def test_every_variable_is_read() -> None:
    env = {
        "FPM_WORKER_ID": "w-7",
        "FPM_PORT_BASE": "21000",
        "FPM_BIND_HOST": "10.0.0.5",
        "FPM_HEARTBEAT_INTERVAL_S": "0.25",
        "FPM_SEND_INTERVAL_S": "0",
        "UNRELATED": "x",
    }
    config = ShimConfig.from_env(env)
    assert (config.worker_id, config.port_base, config.bind_host, config.heartbeat_interval_s) == (
        "w-7",
        21000,
        "10.0.0.5",
        0.25,
    )
    assert config.endpoint(1) == "tcp://10.0.0.5:21001"
    assert config.send_interval_s == 0.0 and ShimConfig.from_env({}).send_interval_s == 0.1
    assert ShimConfig.from_env(config.to_env()) == config


def test_empty_values_take_defaults() -> None:
    assert ShimConfig.from_env({"FPM_PORT_BASE": " ", "FPM_BIND_HOST": "", "FPM_HEARTBEAT_INTERVAL_S": ""}) == (
        ShimConfig()
    )


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FPM_PORT_BASE": "http"}, "FPM_PORT_BASE"),
        ({"FPM_PORT_BASE": "70000"}, "FPM_PORT_BASE"),
        ({"FPM_PORT_BASE": "0"}, "FPM_PORT_BASE"),
        ({"FPM_HEARTBEAT_INTERVAL_S": "soon"}, "FPM_HEARTBEAT_INTERVAL_S"),
        ({"FPM_HEARTBEAT_INTERVAL_S": "0"}, "FPM_HEARTBEAT_INTERVAL_S"),
        ({"FPM_HEARTBEAT_INTERVAL_S": "nan"}, "FPM_HEARTBEAT_INTERVAL_S"),
        ({"FPM_SEND_INTERVAL_S": "-0.1"}, "FPM_SEND_INTERVAL_S"),
        ({"FPM_SEND_INTERVAL_S": "often"}, "FPM_SEND_INTERVAL_S"),
        ({"FPM_SEND_INTERVAL_S": "inf"}, "FPM_SEND_INTERVAL_S"),
        ({"FPM_BIND_HOST": "a b"}, "FPM_BIND_HOST"),
        ({"FPM_WORKER_ID": " w-1"}, "FPM_WORKER_ID"),
    ],
)
def test_bad_values_raise_a_config_error_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        ShimConfig.from_env(env)
