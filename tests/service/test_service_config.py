"""Service configuration: YAML then environment, validated when loaded, with exact error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.discovery import Role
from planner.errors import ConfigError
from planner.service.config import ActuatorKind, load_config
from planner.service.runner import PlannerRunner


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "planner.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_config(None, {})
    assert config.tick_interval_s == 5.0
    assert config.http.port == 8080
    assert config.actuator.kind == ActuatorKind.ADVISORY
    assert config.auth_token is None


def test_file_then_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "tick_interval_s: 2.5\nhttp: {host: 0.0.0.0, port: 9000}\ndiscovery: {default_ttl_s: 10}\n")
    config = load_config(path, {"FPM_PLANNER_PORT": "9100", "FPM_PLANNER_TOKEN": "s3cret"})
    assert config.tick_interval_s == 2.5
    assert config.http.host == "0.0.0.0"
    assert config.http.port == 9100  # the environment wins
    assert config.discovery.default_ttl_s == 10
    assert config.auth_token == "s3cret"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("tick_interval_s: -1\n", {}, "{path}: tick_interval_s: expected float > 0.0"),
        ("tick_interval: 1\n", {}, "{path}: object contains unknown field tick_interval"),
        ("http: {port: 70000}\n", {}, "{path}: http.port: expected int <= 65535"),
        ("http: {port: abc}\n", {}, "{path}: http.port: expected int, got str"),
        ("actuator: {kind: magic}\n", {}, "{path}: actuator.kind: invalid enum value 'magic'"),
        ("- a\n- b\n", {}, "{path}: expected a mapping at the top level, got list"),
        ("auth_token: x\n", {}, "{path}: auth_token: not allowed in the file; set FPM_PLANNER_TOKEN instead"),
        (
            "discovery: {default_ttl_s: 100, max_ttl_s: 10}\n",
            {},
            "{path}: discovery.max_ttl_s must be >= discovery.default_ttl_s",
        ),
        ("{}\n", {"FPM_PLANNER_PORT": "abc"}, "FPM_PLANNER_PORT: expected an integer, got 'abc'"),
        ("{}\n", {"FPM_PLANNER_TICK_INTERVAL_S": "soon"}, "FPM_PLANNER_TICK_INTERVAL_S: expected a number, got 'soon'"),
        (
            "{}\n",
            {"FPM_PLANNER_TICK_INTERVAL_S": "0"},
            "FPM_PLANNER_TICK_INTERVAL_S: tick_interval_s: expected float > 0.0",
        ),
        ("{}\n", {"FPM_PLANNER_ACTUATOR": "k8s"}, "FPM_PLANNER_ACTUATOR: actuator.kind: invalid enum value 'k8s'"),
    ],
    ids=[
        "negative tick",
        "unknown field",
        "port too large",
        "port not a number",
        "unknown actuator",
        "not a mapping",
        "token in the file",
        "max ttl below default",
        "env port not a number",
        "env tick not a number",
        "env tick zero",
        "env unknown actuator",
    ],
)
def test_errors_name_the_source_and_the_field(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    assert str(info.value) == message.format(path=path)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read: No such file or directory"):
        load_config(missing, {})
    with pytest.raises(ConfigError, match=r"planner\.yaml: not valid YAML"):
        load_config(write(tmp_path, "a: [1, 2\n"), {})


def test_the_core_section_is_validated_when_the_runner_is_built(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "core: {roles: {decode: {min_replicas: 5, max_replicas: 2}}}\n"), {})
    with pytest.raises(ConfigError, match="min_replicas <= max_replicas"):
        PlannerRunner(config)


def test_a_missing_static_workers_file_is_a_config_error(tmp_path: Path) -> None:
    config = load_config(None, {"FPM_PLANNER_WORKERS_FILE": str(tmp_path / "absent.yaml")})
    with pytest.raises(ConfigError, match=r"^discovery.static_file: cannot read workers file"):
        PlannerRunner(config)


CHART_SHAPED = """
http: {host: 0.0.0.0, port: 8080}
tick_interval_s: 5
discovery: {registration: true}
services: {prefill: prefill, decode: vllm-decode}
core: {roles: {decode: {min_replicas: 2}}}
actuator:
  kind: kubernetes
  options: {namespace: llm, targets: [{service: decode, kind: dgd, name: vllm-disagg}]}
kubernetes: {namespace: llm, pod_discovery: {enabled: true}}
"""


def test_the_helm_charts_config_shape_loads_and_services_name_each_roles_service(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CHART_SHAPED), {})
    assert config.services == {"prefill": "prefill", "decode": "vllm-decode"}
    runner = PlannerRunner(config)  # no actuator, no cluster: only the core configuration matters here
    assert runner.core_config.role(Role.DECODE).service == "vllm-decode"
    assert runner.core_config.role(Role.DECODE).min_replicas == 2
    assert runner.core_config.role(Role.PREFILL).service == "prefill"
    assert runner.core_config.role(Role.AGG).service is None


def test_core_roles_service_wins_over_services(tmp_path: Path) -> None:
    path = write(tmp_path, "services: {decode: a}\ncore: {roles: {decode: {service: b}}}\n")
    assert PlannerRunner(load_config(path, {})).core_config.role(Role.DECODE).service == "b"


def test_services_name_known_roles(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "services: {router: r}\n"), {})
    assert (
        str(info.value)
        == f"{tmp_path / 'planner.yaml'}: services: unknown role 'router' (expected agg, decode or prefill)"
    )
