"""The launcher's own settings: validated before vLLM is imported, with errors that name the flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from planner.discovery import Role
from planner.errors import ConfigError
from worker_shim.launcher import LauncherSettings, add_launcher_arguments


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_launcher_arguments(parser)
    parser.add_argument("--model", default="org/model")
    return parser.parse_args(list(argv))


def test_cold_start_passes_the_id_to_the_engine(tmp_path: Path) -> None:
    settings = LauncherSettings.from_args(
        _args("--worker-id", "w-1", "--register-file", str(tmp_path / "w.yaml"), "--advertise-host", "10.1.2.3"),
        {"FPM_PORT_BASE": "21000"},
    )
    assert settings.engine_env()["FPM_WORKER_ID"] == "w-1"
    assert settings.engine_env()["FPM_PORT_BASE"] == "21000"
    assert settings.endpoints(2) == ("tcp://10.1.2.3:21000", "tcp://10.1.2.3:21001")
    assert settings.service == "org/model" and settings.role is Role.AGG


def test_restore_starts_the_engine_without_an_id(tmp_path: Path) -> None:
    settings = LauncherSettings.from_args(
        _args("--restore", "--register-file", str(tmp_path / "w.yaml")), {"FPM_WORKER_ID": "w-env"}
    )
    assert settings.worker_id == "w-env"
    assert "FPM_WORKER_ID" not in settings.engine_env()


def test_token_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    from_file = LauncherSettings.from_args(
        _args("--worker-id", "w", "--register-url", "http://p:8080", "--register-token-file", str(token)), {}
    )
    from_env = LauncherSettings.from_args(
        _args("--worker-id", "w", "--register-url", "http://p:8080"), {"FPM_REGISTER_TOKEN": "xyz"}
    )
    assert (from_file.register_token, from_env.register_token) == ("abc", "xyz")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (("--register-file", "w.yaml"), {}, "--worker-id"),
        (("--worker-id", "w"), {}, "--register-url .* or --register-file"),
        (("--worker-id", "w", "--register-url", "http://p", "--register-file", "w.yaml"), {}, "not both"),
        (("--worker-id", "w", "--register-url", "http://p"), {}, "needs a token"),
        (("--worker-id", "w", "--register-file", "w.yaml", "--sync-timeout-s", "0"), {}, "--sync-timeout-s"),
        (("--worker-id", "w", "--register-file", "w.yaml", "--lease-ttl-s", "-1"), {}, "--lease-ttl-s"),
        (("--worker-id", "w", "--register-file", "w.yaml"), {"FPM_PORT_BASE": "x"}, "FPM_PORT_BASE"),
        (
            ("--worker-id", "w", "--register-url", "http://p", "--register-token-file", "/nonexistent/t"),
            {},
            "--register-token-file",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LauncherSettings.from_args(_args(*argv), env)
