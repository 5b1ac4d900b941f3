"""Configuration of a simulated fleet (:class:`~planner.sim.fleet.SimFleet`): engine settings, start-up mode
and delays, the router kind, disaggregation and the FPM heartbeat interval, validated when built."""

from __future__ import annotations

import enum

import msgspec

from planner.discovery import Role
from planner.errors import ConfigError
from planner.sim.engine import EngineConfig

__all__ = ["FleetConfig", "RouterKind", "StartupMode"]


class RouterKind(enum.StrEnum):
    LEAST_TOKENS = "least_tokens"  # least outstanding (prompt + output) tokens
    ROUND_ROBIN = "round_robin"


class StartupMode(enum.StrEnum):
    COLD = "cold"  # pull, load weights, compile, capture graphs
    RESTORE = "restore"  # snapshot restore


class FleetConfig(msgspec.Struct, frozen=True, kw_only=True):
    engine: EngineConfig = EngineConfig()
    disaggregated: bool = False
    cold_start_s: float = 60.0
    restore_start_s: float = 15.0
    startup_mode: StartupMode = StartupMode.COLD
    gpus_per_replica: int = 1
    router: RouterKind = RouterKind.LEAST_TOKENS
    kv_transfer_s: float = 0.02
    heartbeat_interval_s: float = 1.0
    service_prefix: str = "sim"

    def __post_init__(self) -> None:
        if self.cold_start_s < 0 or self.restore_start_s < 0 or self.kv_transfer_s < 0:
            raise ConfigError("fleet delays must be >= 0")
        if self.gpus_per_replica < 1 or self.heartbeat_interval_s <= 0:
            raise ConfigError("fleet needs gpus_per_replica >= 1 and heartbeat_interval_s > 0")

    @property
    def startup_s(self) -> float:
        return self.cold_start_s if self.startup_mode is StartupMode.COLD else self.restore_start_s

    @property
    def roles(self) -> tuple[Role, ...]:
        return (Role.PREFILL, Role.DECODE) if self.disaggregated else (Role.AGG,)
