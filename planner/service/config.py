"""Service configuration: a YAML file, then the environment on top, validated when loaded.

Every error is a :class:`~planner.errors.ConfigError` whose message names the source (file or variable) and
the field, e.g. ``planner.yaml: tick_interval_s: expected float > 0.0, got -1`` or
``FPM_PLANNER_PORT: expected an integer, got 'abc'``. Nothing here reads the environment by itself: the
caller passes it in as a mapping.

Environment variables (each overrides the file):

=================================  =======================================
``FPM_PLANNER_TOKEN``              operator token (named ``default``): every mutation
``FPM_PLANNER_WORKER_TOKEN``       worker token (named ``worker``): registration only
``FPM_PLANNER_READ_TOKEN``         read-only token (named ``read``)
``FPM_PLANNER_TOKENS_FILE``        ``auth.tokens_file``: named tokens with roles (planner.service.auth)
``FPM_PLANNER_MAX_BODY_BYTES``     ``http.max_body_bytes``
``FPM_PLANNER_HOST``               ``http.host``
``FPM_PLANNER_PORT``               ``http.port``
``FPM_PLANNER_TICK_INTERVAL_S``    ``tick_interval_s``
``FPM_PLANNER_WORKERS_FILE``       ``discovery.static_file``
``FPM_PLANNER_ACTUATOR``           ``actuator.kind``
=================================  =======================================
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from planner.errors import ConfigError
from planner.ingest.store import FpmLimits
from planner.transport.settings import NatsSettings, Transport
from worker_shim.curve import CurveClientKeys, CurveKeyError

__all__ = [
    "ENV_VARS",
    "ActuatorConfig",
    "ActuatorKind",
    "AuthConfig",
    "DiscoveryConfig",
    "HistoryConfig",
    "HttpConfig",
    "IngestConfig",
    "PerfModelSettings",
    "ServiceConfig",
    "ShardsConfig",
    "load_config",
]

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class ActuatorKind(enum.StrEnum):
    ADVISORY = "advisory"  # decide and record, never write
    LOCAL = "local"  # a simulated fleet in this process (demo)
    KUBERNETES = "kubernetes"  # planner.actuators.kubernetes


class HttpConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: Port = 8080
    # request bodies past this are answered 413 before authentication and before parsing
    max_body_bytes: PositiveInt = 1 << 20


class AuthConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tokens_file: str | None = None  # YAML ``tokens: [{name, role, token}]`` (a mounted Secret)


class DiscoveryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    registration: bool = True  # the PUT /v1/workers API
    default_ttl_s: PositiveFloat = 30.0
    max_ttl_s: PositiveFloat = 3600.0
    static_file: str | None = None  # a YAML workers file (planner.discovery.StaticFileDiscovery)
    refresh_interval_s: PositiveFloat = 1.0  # how often leases are expired and the subscriber follows


class ShardsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sharded ingest (docs/fleet_scale.md): the decision core reads the ingest shards' summaries from NATS."""

    enabled: bool = False  # needs transport: nats; the shards run as `python -m planner.shard`
    # a shard whose newest summary is older is stale: its workers count as not fresh (<= ingest.ttl_s)
    max_summary_age_s: PositiveFloat = 3.0
    # fleet-wide perf-model training points the shards forward to the leader per second (0: none; none either
    # with perf_model.enabled: false), split over the live shards (planner.shard.perf_points)
    perf_points_per_s: Annotated[float, msgspec.Meta(ge=0.0)] = 512.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.perf_points_per_s):
            raise ValueError(f"perf_points_per_s: expected a finite number >= 0, got {self.perf_points_per_s}")


class IngestConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ttl_s: PositiveFloat = 10.0
    window_size: PositiveInt = 256
    max_msg_bytes: PositiveInt = 64 * 1024
    # transport: zmq: the subscriber's shortest time between receive rounds (each round drains every ready socket).
    # Longer rounds gather more messages per socket and cost less CPU per sample, for up to that much more delay
    # before a sample is stored (docs/fleet_scale.md: 0.2 s with FPM_SEND_INTERVAL_S=0.2 at 4,096 endpoints).
    round_interval_s: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.1
    limits: FpmLimits = FpmLimits()  # plausibility limits on FPM counts (beyond one: dropped as invalid_value)
    transport: Transport = Transport.ZMQ  # zmq: one SUB per endpoint (default) | nats: see docs/fleet_scale.md
    nats: NatsSettings = NatsSettings()  # with transport: nats (servers, namespace, user, password_file)
    shards: ShardsConfig = ShardsConfig()  # enabled: read shard summaries instead of raw samples
    curve_server_public_key_file: str | None = None  # CURVE on the FPM link: the publishers' server key certificate
    curve_client_secret_key_file: str | None = None  # the planner's own keypair (None: drawn at start)

    def __post_init__(self) -> None:
        if self.shards.enabled and self.transport is not Transport.NATS:
            raise ValueError("shards.enabled needs transport: nats")
        if self.shards.enabled and self.shards.max_summary_age_s > self.ttl_s:
            raise ValueError("shards.max_summary_age_s must be <= ttl_s")

    def curve_keys(self) -> CurveClientKeys | None:
        """The subscriber's CURVE keys, read from their files now (None: CURVE off); a file that cannot be read
        or lacks its key raises ConfigError naming the settings."""
        if self.curve_server_public_key_file is None:
            return None
        try:
            return CurveClientKeys.from_files(self.curve_server_public_key_file, self.curve_client_secret_key_file)
        except CurveKeyError as exc:
            raise ConfigError(f"ingest.curve_server_public_key_file / curve_client_secret_key_file: {exc}") from exc


class HistoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_decisions: PositiveInt = 5000  # decision records kept (one per role per tick)
    max_outcomes: PositiveInt = 1000  # actuator outcomes kept
    max_errors: PositiveInt = 50  # recent actuator errors shown in diagnostics


class PerfModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The online perf model (perf_model.PerfModel, one per role), fed from the FleetStore every tick. Once it
    is ready the decision core runs in SLA mode for roles whose mode is ``auto`` or ``sla``."""

    enabled: bool = True
    profile_dir: str | None = None  # a measured profile to bootstrap from (ready at once); None: live only
    max_samples_per_tick: PositiveInt = 4096  # samples offered per tick, the newest of every rank in equal shares


class ActuatorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: ActuatorKind = ActuatorKind.ADVISORY
    options: dict[str, Any] = {}  # passed to the actuator's factory


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    http: HttpConfig = HttpConfig()
    tick_interval_s: PositiveFloat = 5.0
    # the core runs off the event loop: a tick whose core step takes longer holds (decide_deadline_missed)
    tick_deadline_s: PositiveFloat = 10.0
    what_if_deadline_s: PositiveFloat = 5.0  # a what-if taking longer answers 504
    what_if_concurrency: PositiveInt = 2  # what-ifs computing at once; one more answers 503
    discovery: DiscoveryConfig = DiscoveryConfig()
    ingest: IngestConfig = IngestConfig()
    history: HistoryConfig = HistoryConfig()
    actuator: ActuatorConfig = ActuatorConfig()
    perf_model: PerfModelSettings = PerfModelSettings()
    # role -> the deployment's service name that role decides even while no worker of it is discovered
    # (shorthand for core.roles.<role>.service, which wins when both are set)
    services: dict[str, str] = {}
    core: dict[str, Any] = {}  # the decision core's configuration (planner.core), validated by the core
    kubernetes: dict[str, Any] | None = None  # pod discovery and leader election (planner.k8s.setup)
    operations: dict[str, Any] = {}  # durable state, fallback, Events (planner.service.operations)
    auth: AuthConfig = AuthConfig()
    auth_token: str | None = None  # from FPM_PLANNER_TOKEN only; a token in the file is refused
    auth_worker_token: str | None = None  # from FPM_PLANNER_WORKER_TOKEN only
    auth_read_token: str | None = None  # from FPM_PLANNER_READ_TOKEN only

    def __post_init__(self) -> None:
        if self.discovery.max_ttl_s < self.discovery.default_ttl_s:
            raise ValueError("discovery.max_ttl_s must be >= discovery.default_ttl_s")
        for role, service in self.services.items():
            if role not in ("prefill", "decode", "agg"):
                raise ValueError(f"services: unknown role {role!r} (expected agg, decode or prefill)")
            if not service:
                raise ValueError(f"services.{role}: the service name must not be empty")

    def core_config_data(self) -> dict[str, Any]:
        """The ``core`` section with ``services`` folded in as each role's ``service``."""
        core = dict(self.core)
        if self.services:
            roles = dict(core.get("roles") or {})
            for role, service in self.services.items():
                given = roles.get(role)
                if given is not None and not isinstance(given, dict):
                    continue  # not a mapping: the core's validation names it
                role_data = dict(given or {})
                role_data.setdefault("service", service)
                roles[role] = role_data
            core["roles"] = roles
        return core


ENV_VARS: dict[str, tuple[str, ...]] = {
    "FPM_PLANNER_TOKEN": ("auth_token",),
    "FPM_PLANNER_WORKER_TOKEN": ("auth_worker_token",),
    "FPM_PLANNER_READ_TOKEN": ("auth_read_token",),
    "FPM_PLANNER_TOKENS_FILE": ("auth", "tokens_file"),
    "FPM_PLANNER_MAX_BODY_BYTES": ("http", "max_body_bytes"),
    "FPM_PLANNER_HOST": ("http", "host"),
    "FPM_PLANNER_PORT": ("http", "port"),
    "FPM_PLANNER_TICK_INTERVAL_S": ("tick_interval_s",),
    "FPM_PLANNER_WORKERS_FILE": ("discovery", "static_file"),
    "FPM_PLANNER_ACTUATOR": ("actuator", "kind"),
}
_ENV_INT = {"FPM_PLANNER_PORT", "FPM_PLANNER_MAX_BODY_BYTES"}
_ENV_FLOAT = {"FPM_PLANNER_TICK_INTERVAL_S"}

_TOKEN_FIELDS = {
    "auth_token": "FPM_PLANNER_TOKEN",
    "auth_worker_token": "FPM_PLANNER_WORKER_TOKEN",
    "auth_read_token": "FPM_PLANNER_READ_TOKEN",
}

_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


def _readable(message: str) -> str:
    """msgspec's ``Expected `float` > 0.0 - at `$.x``` becomes ``x: expected float > 0.0``."""
    match = _AT.search(message)
    text = message[: match.start()] if match else message
    text = text.replace("`", "")
    text = text[:1].lower() + text[1:]
    if match and match.group("path"):
        return f"{match.group('path')}: {text}"
    return text


def _set(doc: dict[str, Any], path: tuple[str, ...], value: object, source: str) -> None:
    node = doc
    for key in path[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set {'.'.join(path)}: {key} is not a mapping")
        node = child
    node[path[-1]] = value


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read ``path`` (YAML; optional), apply the ``env`` overrides, validate. Raises :class:`ConfigError`."""
    source = str(path) if path is not None else "defaults"
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{source}: expected a mapping at the top level, got {type(loaded).__name__}")
        doc = dict(loaded or {})
        for key, var in _TOKEN_FIELDS.items():
            if key in doc:
                raise ConfigError(f"{source}: {key}: not allowed in the file; set {var} instead")
    for var, field_path in ENV_VARS.items():
        raw = (env or {}).get(var)
        if raw is None or raw == "":
            continue
        value: object = raw
        if var in _ENV_INT:
            try:
                value = int(raw)
            except ValueError as exc:
                raise ConfigError(f"{var}: expected an integer, got {raw!r}") from exc
        elif var in _ENV_FLOAT:
            try:
                value = float(raw)
            except ValueError as exc:
                raise ConfigError(f"{var}: expected a number, got {raw!r}") from exc
        try:
            msgspec.convert(_nested(field_path, value), ServiceConfig)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ConfigError(f"{var}: {_readable(str(exc))}") from exc
        _set(doc, field_path, value, source)
    try:
        return msgspec.convert(doc, ServiceConfig)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"{source}: {_readable(str(exc))}") from exc


def _nested(path: tuple[str, ...], value: object) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out
