"""The shim's configuration, read from an environment mapping (the engine process's ``os.environ``).

=========================  ==========  ========================================================================
variable                   default     meaning
=========================  ==========  ========================================================================
``FPM_WORKER_ID``          ``""``      registered worker id stamped on every sample; empty until a restored
                                       engine is synced with :func:`worker_shim.sync_worker_id`
``FPM_PORT_BASE``          ``20380``   rank ``r`` binds ``tcp://{FPM_BIND_HOST}:{FPM_PORT_BASE + r}``
``FPM_BIND_HOST``          ``*``       interface the publisher binds (``*`` = all; a pod IP, e.g. from the
                                       downward API, keeps FPM off the pod's other interfaces)
``FPM_HEARTBEAT_INTERVAL_S``  ``1.0``  idle heartbeat period, seconds
``FPM_SEND_INTERVAL_S``    ``0.1``     the publisher sends what is queued in bursts at most this often (a sample
                                       waits at most this long); 0: one send per step as it comes
``FPM_CURVE_SECRET_KEY_FILE``  ``""``  CURVE: the publisher's secret-key certificate (a mounted Secret); set,
                                       FPM is encrypted and only subscribers with its public key read it
``FPM_CURVE_CLIENTS_DIR``  ``""``      CURVE: a directory of the public-key certificates of the only
                                       subscribers let in (ZAP); empty: any holder of the server key
=========================  ==========  ========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from planner.errors import ConfigError
from worker_shim.curve import CurveKeyError, CurveServerKeys
from worker_shim.publisher import DEFAULT_PORT_BASE, DEFAULT_SEND_INTERVAL_S, bind_endpoint

__all__ = [
    "ENV_BIND_HOST",
    "ENV_CURVE_CLIENTS_DIR",
    "ENV_CURVE_SECRET_KEY_FILE",
    "ENV_HEARTBEAT_INTERVAL_S",
    "ENV_PORT_BASE",
    "ENV_SEND_INTERVAL_S",
    "ENV_WORKER_ID",
    "ShimConfig",
]

ENV_WORKER_ID = "FPM_WORKER_ID"
ENV_PORT_BASE = "FPM_PORT_BASE"
ENV_BIND_HOST = "FPM_BIND_HOST"
ENV_HEARTBEAT_INTERVAL_S = "FPM_HEARTBEAT_INTERVAL_S"
ENV_SEND_INTERVAL_S = "FPM_SEND_INTERVAL_S"
ENV_CURVE_SECRET_KEY_FILE = "FPM_CURVE_SECRET_KEY_FILE"
ENV_CURVE_CLIENTS_DIR = "FPM_CURVE_CLIENTS_DIR"


class ShimConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Validated shim settings; build with :meth:`from_env`."""

    worker_id: str = ""
    port_base: int = DEFAULT_PORT_BASE
    bind_host: str = "*"
    heartbeat_interval_s: float = 1.0
    send_interval_s: float = DEFAULT_SEND_INTERVAL_S
    curve_secret_key_file: str = ""
    curve_clients_dir: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.port_base <= 65535:
            raise ConfigError(f"{ENV_PORT_BASE} must be a TCP port in 1..65535, got {self.port_base}")
        if not self.bind_host or any(c.isspace() for c in self.bind_host):
            raise ConfigError(f"{ENV_BIND_HOST} must be a host name, address or '*', got {self.bind_host!r}")
        if not math.isfinite(self.heartbeat_interval_s) or self.heartbeat_interval_s <= 0:
            raise ConfigError(f"{ENV_HEARTBEAT_INTERVAL_S} must be a number > 0, got {self.heartbeat_interval_s}")
        if not math.isfinite(self.send_interval_s) or self.send_interval_s < 0:
            raise ConfigError(f"{ENV_SEND_INTERVAL_S} must be a number >= 0, got {self.send_interval_s}")
        if self.worker_id != self.worker_id.strip():
            raise ConfigError(f"{ENV_WORKER_ID} must not start or end with whitespace, got {self.worker_id!r}")
        if self.curve_clients_dir and not self.curve_secret_key_file:
            raise ConfigError(f"{ENV_CURVE_CLIENTS_DIR} needs {ENV_CURVE_SECRET_KEY_FILE} (the publisher's own keys)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ShimConfig:
        """Read the ``FPM_*`` variables from ``env``; unset or empty ones take their defaults. Raises
        :class:`~planner.errors.ConfigError` naming the variable that does not validate."""
        port_text = env.get(ENV_PORT_BASE, "").strip()
        interval_text = env.get(ENV_HEARTBEAT_INTERVAL_S, "").strip()
        send_text = env.get(ENV_SEND_INTERVAL_S, "").strip()
        try:
            port_base = int(port_text) if port_text else DEFAULT_PORT_BASE
        except ValueError as exc:
            raise ConfigError(f"{ENV_PORT_BASE} must be an integer port, got {port_text!r}") from exc
        try:
            interval_s = float(interval_text) if interval_text else 1.0
        except ValueError as exc:
            raise ConfigError(f"{ENV_HEARTBEAT_INTERVAL_S} must be a number of seconds, got {interval_text!r}") from exc
        try:
            send_interval_s = float(send_text) if send_text else DEFAULT_SEND_INTERVAL_S
        except ValueError as exc:
            raise ConfigError(f"{ENV_SEND_INTERVAL_S} must be a number of seconds, got {send_text!r}") from exc
        return cls(
            worker_id=env.get(ENV_WORKER_ID, ""),
            port_base=port_base,
            bind_host=env.get(ENV_BIND_HOST, "").strip() or "*",
            heartbeat_interval_s=interval_s,
            send_interval_s=send_interval_s,
            curve_secret_key_file=env.get(ENV_CURVE_SECRET_KEY_FILE, "").strip(),
            curve_clients_dir=env.get(ENV_CURVE_CLIENTS_DIR, "").strip(),
        )

    def curve(self) -> CurveServerKeys | None:
        """The publisher's CURVE keys, read from their files now; None when CURVE is off. Raises
        :class:`~planner.errors.ConfigError` naming the variable whose file cannot be used."""
        if not self.curve_secret_key_file:
            return None
        try:
            return CurveServerKeys.from_files(self.curve_secret_key_file, self.curve_clients_dir or None)
        except CurveKeyError as exc:
            raise ConfigError(f"{ENV_CURVE_SECRET_KEY_FILE}/{ENV_CURVE_CLIENTS_DIR}: {exc}") from exc

    def endpoint(self, dp_rank: int) -> str:
        """The endpoint DP rank ``dp_rank`` binds."""
        return bind_endpoint(dp_rank, host=self.bind_host, base_port=self.port_base)

    def to_env(self) -> dict[str, str]:
        """The ``FPM_*`` variables that reproduce this configuration (for launching engine processes)."""
        return {
            ENV_WORKER_ID: self.worker_id,
            ENV_PORT_BASE: str(self.port_base),
            ENV_BIND_HOST: self.bind_host,
            ENV_HEARTBEAT_INTERVAL_S: repr(self.heartbeat_interval_s),
            ENV_SEND_INTERVAL_S: repr(self.send_interval_s),
            ENV_CURVE_SECRET_KEY_FILE: self.curve_secret_key_file,
            ENV_CURVE_CLIENTS_DIR: self.curve_clients_dir,
        }
