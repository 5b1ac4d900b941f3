"""``fpm-planner serve --config PATH``: the planner service on uvicorn. SIGTERM and Ctrl-C stop it cleanly
(the current tick finishes, the subscriber closes)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

import uvicorn

from planner.actuators.base import Actuator
from planner.errors import ConfigError
from planner.service.app import create_app
from planner.service.config import ActuatorKind, ServiceConfig, load_config
from planner.service.decision_log import configure_logging
from planner.service.runner import PlannerRunner
from planner.service.server import GracefulServer

__all__ = ["add_arguments", "build_actuator", "build_runner", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", help="YAML configuration (see docs/service.md)")
    parser.add_argument("--host", help="override http.host")
    parser.add_argument("--port", type=int, help="override http.port")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="json: one JSON object per line (default: text)"
    )


def build_actuator(config: ServiceConfig) -> Actuator | None:
    """The actuator ``actuator.kind`` names; None for advisory (decide and record, never write)."""
    kind = config.actuator.kind
    if kind == ActuatorKind.ADVISORY:
        return None
    if kind == ActuatorKind.KUBERNETES:
        try:
            k8s = importlib.import_module("planner.actuators.kubernetes")  # optional, heavy import
        except ImportError as exc:
            raise ConfigError(f"actuator.kind: kubernetes is not available in this build: {exc}") from exc
        factory = getattr(k8s, "from_options", None)
        if factory is None:
            raise ConfigError("actuator.kind: planner.actuators.kubernetes provides no from_options()")
        actuator: Actuator = factory(dict(config.actuator.options))
        return actuator
    raise ConfigError(f"actuator.kind: {kind.value} is only available in `fpm-planner demo`")


def build_status_sink(config: ServiceConfig, env: Mapping[str, str]) -> Any:
    """Events and conditions on the scaled objects: with the Kubernetes actuator (not advisory) and
    ``operations.events`` on; None otherwise."""
    from planner.service.operations import OperationsConfig

    options = dict(config.actuator.options)
    if config.actuator.kind != ActuatorKind.KUBERNETES or options.get("advisory"):
        return None
    if not OperationsConfig.from_mapping(config.operations).events:
        return None
    sink = importlib.import_module("planner.k8s.status_sink")
    return sink.from_options(options, reporting_instance=env.get("POD_NAME") or "fpm-planner")


def build_runner(config: ServiceConfig, env: Mapping[str, str]) -> tuple[PlannerRunner, Any]:
    """The runner ``config`` describes, and the Kubernetes pieces (pod discovery, Lease elector; None without a
    ``kubernetes`` section) the caller must ``start()`` before serving and ``stop()`` after."""
    pieces: Any = None
    if config.kubernetes is not None:
        setup = importlib.import_module("planner.k8s.setup")  # only with a kubernetes section
        pieces = setup.build_kubernetes(config.kubernetes, env)
    runner = PlannerRunner(
        config,
        actuator=build_actuator(config),
        elector=None if pieces is None else pieces.elector,
        sources=() if pieces is None or pieces.discovery is None else (pieces.discovery,),
        status_sink=build_status_sink(config, env),
    )
    return runner, pieces


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, json_logs=args.log_format == "json")
    env = dict(os.environ)
    if args.host:
        env["FPM_PLANNER_HOST"] = args.host
    if args.port is not None:
        env["FPM_PLANNER_PORT"] = str(args.port)
    try:
        config = load_config(args.config, env)
        runner, pieces = build_runner(config, env)
    except ConfigError as exc:
        print(f"fpm-planner serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(runner)
    server = GracefulServer(uvicorn.Config(app, host=config.http.host, port=config.http.port, log_level=args.log_level))
    if pieces is not None:
        pieces.start()
    try:
        server.run()
    finally:
        if pieces is not None:
            pieces.stop()  # the elector releases its Lease
    return 0
